// Which kernel paths the CUDA backend takes on a device. A build holds code for a list of
// architectures (CMAKE_CUDA_ARCHITECTURES; README "GPU architectures"); the driver runs a
// device on the newest code it can (its own machine code, older machine code of the same
// major version, or PTX it compiles). The kernels needing sm_80 or sm_90 features exist only
// in code built for those (ops/arch_guard.cuh, ops/pdl.cuh), so the choice follows the
// architecture of the code the device runs, not only the device:
//
//   const CudaPaths &p = cuda_device_paths(dev);   // once per device (CudaBackend), or Error
//   p = cuda_emulated_paths(p, 75, 65536);         // a backend emulating an older GPU (tests)
//   if (p.tensor_cores) ... MMA / MMQ GEMMs, tensor-core attention ... else the f32 tile kernels
//
// cuda_select_paths is the pure rule (tests/unit/test_cuda_paths.cpp checks it without a GPU).
#pragma once

namespace moe {

struct CudaPaths {
  int device_arch = 0;   // compute capability as 10 * major + minor (86: RTX 30); 0: unknown
  int code_arch = 0;     // architecture of the code the device runs (__CUDA_ARCH__ / 10); 0: none
  bool usable = false;   // the build has code this device runs
  // Tensor-core kernels (code_arch >= 80: cp.async, ldmatrix, m16n8k16 f16/bf16 and
  // m16n8k32 s8 mma): MMA / MMQ GEMMs, tiled MMA and MLA attention. Else the f32 tile
  // kernels, the split-cell / tiled FMA attention and cuBLAS (which picks its own kernels).
  bool tensor_cores = false;
  // Programmatic dependent launch (code_arch >= 90 on an sm_90+ device; ops/pdl.cuh).
  bool pdl = false;
  int smem_optin = 0;    // bytes of shared memory one block may ask for (opt-in maximum)
};

constexpr int kCudaTensorCoreArch = 80;  // = MOE_CUDA_TENSOR_CORE_ARCH (ops/arch_guard.cuh)
constexpr int kCudaPdlArch = 90;

// The paths for a device of compute capability device_arch (10 * major + minor) running
// code built for code_arch (0: the build has no code it can run) that grants smem_optin
// bytes of shared memory per block.
constexpr CudaPaths cuda_select_paths(int device_arch, int code_arch, int smem_optin) {
  CudaPaths p;
  p.device_arch = device_arch;
  p.code_arch = code_arch;
  p.usable = code_arch > 0 && code_arch <= device_arch;
  p.tensor_cores = p.usable && code_arch >= kCudaTensorCoreArch;
  p.pdl = p.usable && code_arch >= kCudaPdlArch;
  p.smem_optin = smem_optin;
  return p;
}

// The paths of a device of paths `own` made to take those of an sm_<arch> device granting at
// most smem_optin bytes per block (GpuEmulation; e.g. 75, 64 KB: the Turing fallbacks on an
// H200; 86, 101376: an RTX 30's shared memory). arch 0: `own` unchanged.
constexpr CudaPaths cuda_emulated_paths(const CudaPaths &own, int arch, int smem_optin) {
  if (arch <= 0) return own;
  auto lower = [](int a, int b) { return a < b ? a : b; };
  return cuda_select_paths(lower(own.device_arch, arch), lower(own.code_arch, arch), lower(own.smem_optin, smem_optin));
}

// Whether an executor launches with programmatic dependent launch: where its options ask for
// it (GpuTuning::dependent_launch) and the device runs sm_90 code, whose pdl_wait is real.
constexpr bool cuda_use_pdl(bool dependent_launch, const CudaPaths &p) { return dependent_launch && p.pdl; }

// The paths of CUDA device `device` itself (read once per device; a CudaBackend applies its
// GpuEmulation on top).
// Error(Unsupported) naming the device and the architectures of this build when it has no
// code the device can run.
CudaPaths cuda_device_paths(int device);
// Of the current device (cudaGetDevice), itself: launchers take the backend's paths from
// CudaOpCtx::paths (or LaunchStream::smem_optin), which include its emulation.
CudaPaths cuda_current_paths();

// The architecture of the code device `device` runs from this build (__CUDA_ARCH__ / 10; 0:
// none), from the attributes of a probe kernel (ops/code_arch.cu).
int cuda_code_arch(int device);
// Test hook: the __CUDA_ARCH__ / 10 a kernel launched on the current device reports; its wait
// goes through the counted sync point, on `counted` (the caller's backend).
class CudaCounters;
int cuda_code_arch_launched(CudaCounters &counted);

}  // namespace moe
