# CUDA is used only when asked for, a toolkit is found, and libtorch itself was built with CUDA.
# CRL_GPU_PATH (scripts/bootstrap.sh --cuda sets it) turns "when found" into "required": the
# configure fails unless the CUDA kernels, the NCCL backend and CUDA IPC (sync/CMakeLists.txt) are
# all built, so a GPU build folder never quietly becomes a second CPU build.
option(CRL_GPU_PATH "Require the CUDA kernels, the NCCL backend and CUDA IPC (the GPU build path)" OFF)
set(CRL_CUDA_ENABLED OFF)
if(CRL_WITH_CUDA OR CRL_GPU_PATH)
  include(CheckLanguage)
  check_language(CUDA)
  if(CMAKE_CUDA_COMPILER AND TARGET torch_cuda)
    enable_language(CUDA)
    set(CRL_CUDA_ENABLED ON)
  elseif(CMAKE_CUDA_COMPILER)
    set(crl_cuda_why "CUDA toolkit found but libtorch has no CUDA")
  else()
    set(crl_cuda_why "no CUDA compiler found")
  endif()
endif()
if(CRL_GPU_PATH AND NOT CRL_CUDA_ENABLED)
  message(FATAL_ERROR "CRL_GPU_PATH: ${crl_cuda_why} (Torch_DIR=${Torch_DIR}); "
                      "scripts/bootstrap.sh --cuda configures this path")
endif()
if(crl_cuda_why)
  message(STATUS "${crl_cuda_why}: building the CPU path only")
endif()
if(CRL_CUDA_ENABLED)
  message(STATUS "colocated-rl: CUDA kernels ON (architectures ${TORCH_CUDA_ARCH_LIST}, "
                 "nvcc ${CMAKE_CUDA_COMPILER_VERSION}, libtorch ${Torch_VERSION})")
else()
  message(STATUS "colocated-rl: CUDA kernels OFF")
endif()

# crl_add_cuda_sources(<target> <files...>): appended only when CUDA is enabled (CRL_WITH_CUDA is
# then defined for every module by crl_common, common/CMakeLists.txt).
function(crl_add_cuda_sources target)
  if(CRL_CUDA_ENABLED)
    target_sources(${target} PRIVATE ${ARGN})
    # The -gencode flags come from libtorch's config (TORCH_CUDA_ARCH_LIST, CMakeLists.txt).
    set_target_properties(${target} PROPERTIES CUDA_ARCHITECTURES OFF)
  endif()
endfunction()
