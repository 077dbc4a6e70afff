#!/bin/sh
# Builds the host emulation of the DeltaNet kernel with its fused output norm (delta_net.cu,
# DeltaNorm) and checks it bit for bit against the unfused kernel + gated_norm_kernel and
# against a float64 reference: run_dnnorm.sh. Needs g++ >= 12 (C++20) and the CUDA headers.
set -e
HERE=$(cd "$(dirname "$0")" && pwd)
. "$HERE/emu_env.sh"
emu_one_file dnnorm
