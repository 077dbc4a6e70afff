# Decides whether the CUDA backend is built (MOEINFER_CUDA=AUTO|ON|OFF).
#   ON    build it; fails when no CUDA compiler is found (CI compiles it on machines without a GPU)
#   AUTO  build it only when this machine has an NVIDIA GPU *and* a CUDA compiler: a toolkit
#         alone is not enough, since compiling the kernels costs far more than a CPU-only
#         build and nothing could run them here
#   OFF   CPU only
# Sets MOEINFER_HAVE_CUDA (built) and MOEINFER_GPU_PRESENT (a GPU answered at configure time).
#
# Architectures (CMAKE_CUDA_ARCHITECTURES; README "GPU architectures"): by default machine
# code for Turing (75: RTX 20, T4), Ampere (80: A100; 86: RTX 30, A10; 87: Jetson Orin), Ada
# (89: RTX 40, L4), Hopper (90: H100, H200) and Blackwell (120: RTX 50), plus PTX of compute_90
# (no extra compile pass) that the driver compiles for newer GPUs without their own code
# (sm_100 B200, ...). Entries the toolkit cannot build (nvcc --list-gpu-arch) are dropped
# with a message. -DMOEINFER_CUDA_ARCHITECTURES=... (or CMake's own -DCMAKE_CUDA_ARCHITECTURES)
# replaces the whole list, e.g. "native" or 86 for a faster build for one GPU.
set(MOEINFER_CUDA_DEFAULT_ARCHITECTURES 75-real 80-real 86-real 87-real 89-real 90 120-real)
set(MOEINFER_CUDA_ARCHITECTURES "" CACHE STRING
  "CUDA architectures to build, e.g. \"86\" or \"native\" (empty: CMAKE_CUDA_ARCHITECTURES if given, else MOEINFER_CUDA_DEFAULT_ARCHITECTURES)")

function(moeinfer_pick_cuda_architectures)
  if(MOEINFER_CUDA_ARCHITECTURES)
    set(CMAKE_CUDA_ARCHITECTURES ${MOEINFER_CUDA_ARCHITECTURES} CACHE STRING "CUDA architectures" FORCE)
    set(_why "MOEINFER_CUDA_ARCHITECTURES")
  elseif(DEFINED CMAKE_CUDA_ARCHITECTURES AND NOT "${CMAKE_CUDA_ARCHITECTURES}" STREQUAL "${MOEINFER_CUDA_PICKED_ARCHITECTURES}")
    set(_why "CMAKE_CUDA_ARCHITECTURES")
  else()
    # Keep what this toolkit can compile (CUDA 13 dropped sm_50..sm_72; sm_120 needs 12.8).
    set(_list ${MOEINFER_CUDA_DEFAULT_ARCHITECTURES})
    execute_process(COMMAND ${CMAKE_CUDA_COMPILER} --list-gpu-arch RESULT_VARIABLE _rc OUTPUT_VARIABLE _known ERROR_QUIET TIMEOUT 60)
    if(_rc EQUAL 0 AND _known MATCHES "compute_")
      set(_kept "")
      foreach(_a ${_list})
        string(REGEX REPLACE "-.*" "" _num "${_a}")
        if(_known MATCHES "compute_${_num}[^0-9]|compute_${_num}$")
          list(APPEND _kept ${_a})
        else()
          message(STATUS "moeinfer: CUDA architecture ${_a} dropped: ${CMAKE_CUDA_COMPILER} cannot build it (nvcc --list-gpu-arch)")
        endif()
      endforeach()
      set(_list ${_kept})
    endif()
    if(NOT _list)
      message(FATAL_ERROR "moeinfer: ${CMAKE_CUDA_COMPILER} builds none of ${MOEINFER_CUDA_DEFAULT_ARCHITECTURES}: set CMAKE_CUDA_ARCHITECTURES")
    endif()
    set(CMAKE_CUDA_ARCHITECTURES ${_list} CACHE STRING "CUDA architectures" FORCE)
    set(MOEINFER_CUDA_PICKED_ARCHITECTURES "${_list}" CACHE INTERNAL "the default list as this toolkit builds it")
    set(_why "default list")
  endif()
  message(STATUS "moeinfer: CUDA architectures (${_why}): ${CMAKE_CUDA_ARCHITECTURES}")
endfunction()
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
    moeinfer_pick_cuda_architectures()
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
