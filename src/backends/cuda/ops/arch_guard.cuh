// Which device code a compilation pass holds. The tensor-core kernels (cp.async copies,
// ldmatrix, mma.sync m16n8k16 f16/bf16 and m16n8k32 s8) need sm_80: compiled for an older
// target (sm_75) their bodies are a trap, and the backend never launches them there
// (cuda_paths.h chooses the paths from the architecture the device's code was built for).
// The host pass and the host emulation (tools/cuda_emu) see every body.
#pragma once

#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800
#define MOE_CUDA_TENSOR_CORE_CODE 1
#else
#define MOE_CUDA_TENSOR_CORE_CODE 0
// This pass drops the tensor-core kernel bodies, so the helpers only they use go unreferenced.
#pragma nv_diag_suppress 177
#endif

// The oldest architecture whose code holds the tensor-core kernels (cuda_select_paths).
#define MOE_CUDA_TENSOR_CORE_ARCH 80
