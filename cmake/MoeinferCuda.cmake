# Decides whether the CUDA backend is built (MOEINFER_CUDA=AUTO|ON|OFF).
#   ON    build it; fails when no CUDA compiler is found (CI compiles it on machines without a GPU)
#   AUTO  build it only when this machine has an NVIDIA GPU *and* a CUDA compiler: a toolkit
#         alone is not enough, since compiling the kernels costs far more than a CPU-only
#         build and nothing could run them here
#   OFF   CPU only
# Sets MOEINFER_HAVE_CUDA (built) and MOEINFER_GPU_PRESENT (a GPU answered at configure time).
set(MOEINFER_HAVE_CUDA OFF)

# A GPU is present when the driver lists one (nvidia-smi -L) or its device node exists.
set(MOEINFER_GPU_PRESENT OFF)
find_program(MOEINFER_NVIDIA_SMI nvidia-smi)
if(MOEINFER_NVIDIA_SMI)
  execute_process(COMMAND ${MOEINFER_NVIDIA_SMI} -L RESULT_VARIABLE _smi_rc OUTPUT_VARIABLE _smi_out ERROR_QUIET TIMEOUT 20)
  if(_smi_rc EQUAL 0 AND _smi_out MATCHES "GPU [0-9]")
    set(MOEINFER_GPU_PRESENT ON)
  endif()
endif()
if(EXISTS /dev/nvidia0 OR EXISTS /dev/nvhost-gpu)  # discrete GPUs; Jetson's integrated GPU
  set(MOEINFER_GPU_PRESENT ON)
endif()

set(_want_cuda OFF)
if(MOEINFER_CUDA STREQUAL "ON" OR (MOEINFER_CUDA STREQUAL "AUTO" AND MOEINFER_GPU_PRESENT))
  set(_want_cuda ON)
endif()
if(_want_cuda)
  include(CheckLanguage)
  if(NOT DEFINED CMAKE_CUDA_COMPILER AND EXISTS /usr/local/cuda/bin/nvcc)
    set(CMAKE_CUDA_COMPILER /usr/local/cuda/bin/nvcc)
  endif()
  check_language(CUDA)
  if(CMAKE_CUDA_COMPILER)
    if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES)
      # Jetson Orin (87) and Hopper (90) at least; one instance per arch, so keep it short.
      set(CMAKE_CUDA_ARCHITECTURES 87 90)
    endif()
    enable_language(CUDA)
    find_package(CUDAToolkit REQUIRED)
    set(MOEINFER_HAVE_CUDA ON)
  elseif(MOEINFER_CUDA STREQUAL "ON")
    message(FATAL_ERROR "MOEINFER_CUDA=ON but no CUDA compiler was found (install the CUDA toolkit or configure with -DMOEINFER_CUDA=OFF)")
  endif()
endif()
if(MOEINFER_HAVE_CUDA)
  message(STATUS "moeinfer: CUDA backend ON (MOEINFER_CUDA=${MOEINFER_CUDA}, GPU present: ${MOEINFER_GPU_PRESENT})")
else()
  message(STATUS "moeinfer: CUDA backend OFF (MOEINFER_CUDA=${MOEINFER_CUDA}, GPU present: ${MOEINFER_GPU_PRESENT}; -DMOEINFER_CUDA=ON forces it)")
endif()
