#!/usr/bin/env python3
"""Checks the CUDA architectures a build holds against the ones it claims.

usage: check_cuda_archs.py --binary LIB --archs "75-real;80-real;90"   every CUDA object's
           fatbin in LIB holds machine code (ELF) for each NN-real / NN entry and PTX for each
           NN-virtual / NN entry, and nothing else
       check_cuda_archs.py --readme README.md --archs "75-real;..."       the README names
           this list as the default (so changing the list without the README fails)

Fatbins are found by their magic number and read by their entry headers (kind 1 = PTX,
2 = ELF, architecture as 10 * major + minor), as nvcc 11..13 write them; no cuobjdump needed
(minimal toolkits lack it)."""
import argparse
import struct
import sys

FATBIN_MAGIC = struct.pack('<I', 0xBA55ED50)


def fatbins(data):
    """[(offset, {('elf' | 'ptx', arch), ...})] of every fatbin in data."""
    out, i = [], 0
    while True:
        i = data.find(FATBIN_MAGIC, i)
        if i < 0 or i + 16 > len(data):
            return out
        _version, header_size, fat_size = struct.unpack_from('<HHQ', data, i + 4)
        p, end, entries = i + header_size, i + header_size + fat_size, set()
        while p + 32 <= end:
            kind, _, entry_header, size = struct.unpack_from('<HHIQ', data, p)
            arch = struct.unpack_from('<I', data, p + 28)[0]
            if entry_header == 0:
                break
            entries.add(({1: 'ptx', 2: 'elf'}.get(kind, 'kind%d' % kind), arch))
            p += entry_header + size
        out.append((i, entries))
        i = max(end, i + 4)


def expected(archs):
    want = set()
    for a in archs:
        num, _, suffix = a.partition('-')
        if not num.isdigit():
            return None  # native / all / all-major: not known before the build
        if suffix in ('', 'real'):
            want.add(('elf', int(num)))
        if suffix in ('', 'virtual'):
            want.add(('ptx', int(num)))
    return want


def name(e):
    return ('sm_%d' if e[0] == 'elf' else 'compute_%d PTX') % e[1]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument('--archs', required=True, help='the CMake list (; or space separated)')
    ap.add_argument('--binary')
    ap.add_argument('--readme')
    args = ap.parse_args()
    archs = args.archs.replace(';', ' ').split()
    if args.readme:
        text = open(args.readme, encoding='utf-8').read()
        quoted = '`' + ' '.join(archs) + '`'
        if quoted not in text:
            print('%s does not name the default CUDA architectures %s (cmake/MoeinferCuda.cmake)' % (args.readme, quoted))
            return 1
        print('%s names the default CUDA architectures %s' % (args.readme, quoted))
    if args.binary:
        want = expected(archs)
        if want is None:
            print('architectures %s are resolved by CMake at build time: not checked' % archs)
            return 0
        found = fatbins(open(args.binary, 'rb').read())
        if not found:
            print('%s holds no CUDA fatbin' % args.binary)
            return 1
        bad = 0
        for off, entries in found:
            if entries != want:
                bad += 1
                print('fatbin at %d: missing %s, unexpected %s' % (off, sorted(map(name, want - entries)), sorted(map(name, entries - want))))
        print('%d fatbins in %s; expected in each: %s' % (len(found), args.binary, ', '.join(sorted(map(name, want)))))
        return 1 if bad else 0
    return 0


if __name__ == '__main__':
    sys.exit(main())
