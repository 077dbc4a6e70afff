// Which kernel paths the CUDA backend takes per device (backends/cuda/cuda_paths.h): the pure
// rule from (device architecture, architecture of the code the build holds for it, shared
// memory per block) runs everywhere, no GPU needed; on a GPU ([cuda]) the probe that finds
// the code's architecture is checked against a kernel that reports its own __CUDA_ARCH__,
// and an sm_80+ device on a default build must keep the tensor-core paths (an H200: PDL too).
// The fallback kernels themselves are compared with the CPU in test_cuda_ops.cpp ([paths]).
#include <catch2/catch.hpp>

#include "backends/backend.h"
#include "backends/cuda/cuda_paths.h"
#ifdef MOEINFER_WITH_CUDA
#include "backends/cuda/cuda_backend.h"
#include "backends/cuda/cuda_common.h"
#include "backends/cuda/ops/matmul_mma.h"
#endif

using namespace moe;

TEST_CASE("cuda paths: chosen from the device and the architecture of its code", "[cuda-paths]") {
  struct Row {
    int device, code;
    bool usable, tc, pdl;
  };
  const Row rows[] = {
      {75, 75, true, false, false},   // RTX 20 / T4: the f32 tile kernels, no PDL
      {80, 80, true, true, false},    // A100
      {86, 86, true, true, false},    // RTX 30
      {86, 80, true, true, false},    // RTX 30 on sm_80 machine code (same major)
      {87, 87, true, true, false},    // Jetson Orin
      {89, 89, true, true, false},    // RTX 40, L4
      {90, 90, true, true, true},     // H100 / H200
      {90, 80, true, true, false},    // Hopper on sm_80 code: griddepcontrol is not in it, so no PDL
      {90, 75, true, false, false},   // Hopper on sm_75 code (a PTX-only build, say): no tensor-core code
      {100, 90, true, true, true},    // B200 on compute_90 PTX
      {120, 120, true, true, true},   // RTX 50
      {61, 0, false, false, false},   // Pascal: no code in this build
      {75, 80, false, false, false},  // code newer than the device never runs
  };
  for (const Row &r : rows) {
    INFO("device sm_" << r.device << ", code sm_" << r.code);
    const CudaPaths p = cuda_select_paths(r.device, r.code, 101376);
    CHECK(p.usable == r.usable);
    CHECK(p.tensor_cores == r.tc);
    CHECK(p.pdl == r.pdl);
    CHECK(p.smem_optin == 101376);
    CHECK(cuda_use_pdl(true, p) == r.pdl);  // the executor's choice with GpuTuning::dependent_launch on
    CHECK_FALSE(cuda_use_pdl(false, p));
  }
}

#ifdef MOEINFER_WITH_CUDA
// The int8 MMQ kernels take up to 112 KB of shared memory: a device granting less per block
// must get one that fits or none (then the f32 tile kernels); the f16 GEMMs fit anywhere.
TEST_CASE("cuda paths: tensor-core GEMMs only where their shared memory fits", "[cuda-paths]") {
  const DType int8_types[] = {DType::Q4_0, DType::Q8_0, DType::MXFP4, DType::Q4_K, DType::Q5_K, DType::Q6_K};
  const DType f16_types[] = {DType::F16, DType::BF16, DType::Q2_K, DType::Q3_K};
  const CudaPaths hopper = cuda_select_paths(90, 90, 232448), ampere = cuda_select_paths(80, 80, 166912);
  const CudaPaths ada = cuda_select_paths(89, 89, 101376), small = cuda_select_paths(80, 80, 48 * 1024);
  const CudaPaths turing = cuda_select_paths(75, 75, 65536);
  for (DType t : int8_types) {
    INFO(dtype_name(t));
    CHECK(cuda_tensor_core_gemm(t, hopper));
    CHECK(cuda_tensor_core_gemm(t, ampere));
    CHECK(cuda_tensor_core_gemm(t, ada));  // 99 KB: Q4_K on the generic kernel, not the 112 KB raw one
    CHECK_FALSE(cuda_tensor_core_gemm(t, small));
    CHECK_FALSE(cuda_tensor_core_gemm(t, turing));
  }
  for (DType t : f16_types) {
    INFO(dtype_name(t));
    CHECK(cuda_tensor_core_gemm(t, ada));
    CHECK(cuda_tensor_core_gemm(t, small));
    CHECK_FALSE(cuda_tensor_core_gemm(t, turing));
  }
  CHECK_FALSE(cuda_tensor_core_gemm(DType::F32, hopper));  // F32 weights: the exact f32 kernels
}
#endif

TEST_CASE("cuda paths: the probe names the architecture of the code the device runs", "[cuda][paths]") {
  BackendRegistry reg;
  if (!reg.find("cuda")) {
    WARN("no CUDA device (or a build without CUDA): CUDA test skipped");
    return;
  }
#ifdef MOEINFER_WITH_CUDA
  const CudaPaths p = cuda_device_paths(0);
  const DeviceInfo &info = reg.find("cuda")->info();
  INFO("device " << info.description << " sm_" << p.device_arch << ", code sm_" << p.code_arch);
  CHECK(p.device_arch == info.compute_major * 10 + info.compute_minor);
  REQUIRE(p.usable);
  CHECK(cuda_code_arch_launched(static_cast<CudaBackend *>(reg.find("cuda"))->counters()) == p.code_arch);
  // The default list has sm_80 code for every sm_8x device and sm_90 code (or PTX) from Hopper on.
  if (p.device_arch >= 80) CHECK(p.tensor_cores);
  if (p.device_arch >= 90) CHECK(p.pdl);
#endif
}

// GpuEmulation (a registry's option): the paths an older GPU would take, never newer ones
// than the device's own, with at most the emulated shared memory.
TEST_CASE("cuda paths: an emulated older device lowers the paths, never raises them", "[cuda-paths]") {
  const CudaPaths h200 = cuda_select_paths(90, 90, 232448);
  CHECK(cuda_emulated_paths(h200, 0, 0).code_arch == 90);  // off: unchanged
  CHECK(cuda_emulated_paths(h200, 0, 1024).smem_optin == 232448);
  const CudaPaths turing = cuda_emulated_paths(h200, 75, 65536);
  CHECK(turing.device_arch == 75);
  CHECK(turing.code_arch == 75);
  CHECK(turing.usable);
  CHECK_FALSE(turing.tensor_cores);
  CHECK_FALSE(turing.pdl);
  CHECK(turing.smem_optin == 65536);
  const CudaPaths rtx30 = cuda_emulated_paths(h200, 86, 101376);
  CHECK(rtx30.device_arch == 86);
  CHECK(rtx30.code_arch == 86);
  CHECK(rtx30.tensor_cores);
  CHECK_FALSE(rtx30.pdl);
  CHECK(rtx30.smem_optin == 101376);
  // An Ampere device asked to be a Hopper stays an Ampere.
  const CudaPaths a100 = cuda_select_paths(80, 80, 166912);
  const CudaPaths up = cuda_emulated_paths(a100, 90, 232448);
  CHECK(up.device_arch == 80);
  CHECK(up.code_arch == 80);
  CHECK_FALSE(up.pdl);
  CHECK(up.smem_optin == 166912);
}
