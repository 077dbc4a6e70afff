#!/bin/sh
# Builds the host emulation of the fused row-chain kernels (fused.cu) and checks that the
# prefill kernel (a warp per row) gives the decode kernel's bits (a block per row), which the
# GPU tests tie to the unfused ops: run_rowchains.sh. Needs g++ >= 12 (C++20) and the CUDA headers.
set -e
HERE=$(cd "$(dirname "$0")" && pwd)
. "$HERE/emu_env.sh"
emu_one_file rowchains
