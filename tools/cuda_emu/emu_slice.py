# The shared step of the one-file generators (gen_route.py, gen_elementwise.py, gen_sequence.py):
# cut the kernels between two markers out of a source in src/backends/cuda/ops, put them in
# namespace moe after the given prelude (#include lines, macro fixes), and append the check
# program, so that one .cpp builds the kernels and their check through emu.h.
import os


def write_slice(repo, out, source, begin, end, prelude, check, name):
    here = os.path.dirname(os.path.abspath(__file__))
    src = open(os.path.join(repo, 'src/backends/cuda/ops', source)).read()
    text = (prelude + 'namespace moe {\n' + src[src.index(begin):src.index(end)] + '}  // namespace moe\n'
            '#include "' + os.path.join(here, check) + '"\n')
    with open(os.path.join(out, name), 'w') as f:
        f.write(text)
