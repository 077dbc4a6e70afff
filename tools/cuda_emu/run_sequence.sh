#!/bin/sh
# Builds the host emulation of the fused op-sequence kernel (fused_sequence.cu) and checks
# deepseek2's MLA glue and sigmoid router tail against host loops: run_sequence.sh.
# Needs g++ >= 12 (C++20) and the CUDA headers.
set -e
HERE=$(cd "$(dirname "$0")" && pwd)
. "$HERE/emu_env.sh"
emu_one_file sequence
