#!/bin/sh
# Builds the host emulation of the MoE routing kernel (matmul.cu: route_kernel) and checks its
# tiles and entries against a host reference: run_route.sh. Needs g++ >= 12 (C++20) and the
# CUDA headers.
set -e
HERE=$(cd "$(dirname "$0")" && pwd)
. "$HERE/emu_env.sh"
emu_one_file route
