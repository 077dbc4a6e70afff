#!/bin/sh
# Builds the host emulation of the elementwise kernels (elementwise.cu) and checks the flat
# kernel against the row kernel bit for bit: run_elementwise.sh. Needs g++ >= 12 and the CUDA headers.
set -e
HERE=$(cd "$(dirname "$0")" && pwd)
. "$HERE/emu_env.sh"
emu_one_file elementwise -w
