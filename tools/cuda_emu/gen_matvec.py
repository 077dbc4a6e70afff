# Writes a host-compilable copy of one version of ops/matvec.cu (its kernels and launch
# helpers, up to the launchers that read graph nodes) to OUT, plus entry points in
# namespace moe::emu_TAG for matvec_check.cpp: PDL and <<< >>> launches become emu_launch,
# dynamic shared memory a static buffer. FLAVOR: "old" (launch(t, down, grid, smem, ...),
# before the MatVecs group) or "new" (rows through launch(t, grid, shape, ...), the expert
# products through launch_expert). Usage: gen_matvec.py MATVEC_CU OUT_CPP TAG FLAVOR
import re
import sys

src, out, tag, flavor = sys.argv[1:5]
s = open(src).read()
s = s[:s.index('// Fields common to every mode')]
s = s.replace('#include "backends/cuda/ops/pdl.cuh"', '')
s = s.replace('extern __shared__ __align__(16) uint8_t smem[];', 'uint8_t *smem = emu_dyn_smem();')
s = re.sub(r'(matvec_kernel<[^;]*?>)<<<grid, block, static_cast<size_t>\(smem\), s>>>\(a\)',
           r'emu_launch(grid, static_cast<int>(block.x), \1, a)', s)
s = s.replace('MOE_CUDA_LAUNCH_CHECK("matvec_kernel");', '')
assert '<<<' not in s, 'a launch the generator does not know'

common = '''
// EmuMv's fields by name (the old and new MvArgs order them differently); others (err) stay zero.
MvArgs to_args(const EmuMv &m) {
  MvArgs a{};
  a.w = m.w; a.w2 = m.w2; a.rb = m.rb; a.eb = m.eb; a.rb2 = m.rb2; a.eb2 = m.eb2; a.K = m.K; a.M = m.M;
  a.x = m.x; a.x_nb1 = m.x_nb1; a.X = m.X; a.ids = m.ids; a.E = m.E; a.n_used = m.n_used; a.cw = m.cw;
  a.add = m.add; a.y = m.y; a.mode = m.mode;
  return a;
}
'''
if flavor == 'old':
    api = common + '''
void launch_mv(DType t, bool down, unsigned gx, unsigned gy, int, int, const EmuMv &m) {
  const MvArgs a = to_args(m);
  launch(t, down, dim3(gx, gy), smem_bytes(t, a.K, down ? a.X : 1, down), nullptr, a);
}
bool launch_grp(const EmuMv &, const EmuSeg *, int, int) { return false; }
bool launch_own(DType, unsigned, unsigned, const EmuMv &) { return false; }
bool launch_unfused(DType, int, const EmuMv &) { return false; }
bool launch_bias(DType, bool, int, const EmuMv &, const EmuBias &) { return false; }
'''
else:
    api = common + '''
void launch_mv(DType t, bool down, unsigned gx, unsigned gy, int groups, int n_sm, const EmuMv &m) {
  const MvArgs a = to_args(m);
  if (down || a.mode == kModeGateUp) {  // the expert products pick their own grid and blocks (launch_expert)
    if (!launch_expert(t, down, LaunchStream{}, a)) std::printf("launch_expert: shared memory does not fit\\n");
    return;
  }
  const MvShape sh = groups ? MvShape{groups, smem_bytes(t, a.K, 1, false, groups)}
                            : block_groups(t, int64_t(gx) * gy, n_sm, smem_bytes(t, a.K, 1, false), smem_bytes(t, a.K, 1, false, 2));
  launch(t, dim3(gx, gy), sh, LaunchStream{}, a);
}
bool launch_grp(const EmuMv &base, const EmuSeg *segs, int n, int n_sm) {
  MvSeg sg[kMaxFusedMatVecs];
  for (int i = 0; i < n; ++i) sg[i] = MvSeg{segs[i].w, segs[i].rb, segs[i].y, segs[i].add, segs[i].M, segs[i].type, segs[i].mode};
  return launch_group(to_args(base), sg, n, n_sm, true, LaunchStream{});  // lean groups: the default
}
// A final output in CUDA's own order (matvec_rows8_kernel<T, false>); false: not such a type.
bool launch_own(DType t, unsigned gx, unsigned gy, const EmuMv &m) {
  const MvArgs a = to_args(m);
  return launch_own_order(t, dim3(gx, gy), smem_bytes(t, a.K, 1, false), LaunchStream{}, a);
}
// A MatMul / MatMulId as cuda_matvec launches it (launch_rows' choice of mode and blocks for
// n_sm); false: the launch did not fit.
bool launch_unfused(DType t, int n_sm, const EmuMv &m) {
  MvArgs a = to_args(m);
  const int smem = smem_bytes(t, a.K, 1, false);
  if (smem < 0) return false;
  launch_rows(LaunchStream{}, n_sm, t, smem, a);
  return true;
}
// Gate/up + SwiGLU-OAI (m.mode kModeGateUp) or down + combine [+ residual] (kModeDown) with
// gpt-oss's expert biases (the bias kernels, folding K as the unfused MatMulId at n_sm does:
// unfused_halves); false: not launched (type or shared memory).
bool launch_bias(DType t, bool down, int n_sm, const EmuMv &m, const EmuBias &eb) {
  const MvArgs a = to_args(m);
  const MvBias b{eb.b, eb.b2, eb.s, eb.s2, eb.alpha, eb.limit, unfused_halves(t, a, n_sm)};
  return launch_expert(t, down, LaunchStream{}, a, &b);
}
'''
s += '}  // namespace\nnamespace emu_' + tag + ' {\n' + api + '}  // namespace emu_' + tag + '\n}  // namespace moe\n'
s = s.replace('namespace moe {\n', 'namespace moe {\nusing namespace moe_emu_api;\n', 1)
open(out, 'w').write('#include <cstdio>\n#include "matvec_api.h"\n' + s)
