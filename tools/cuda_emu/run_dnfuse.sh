#!/bin/sh
# Builds the host emulation of the fused gated DeltaNet kernels (delta_net_fused.cu) and checks
# them against a float64 reference: run_dnfuse.sh. Needs g++ >= 12 (C++20) and the CUDA headers.
set -e
HERE=$(cd "$(dirname "$0")" && pwd)
. "$HERE/emu_env.sh"
emu_one_file dnfuse
