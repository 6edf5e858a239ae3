# CUDA is used only when asked for, a toolkit is found, and libtorch itself was built with CUDA.
set(CRL_CUDA_ENABLED OFF)
if(CRL_WITH_CUDA)
  include(CheckLanguage)
  check_language(CUDA)
  if(CMAKE_CUDA_COMPILER AND TARGET torch_cuda)
    enable_language(CUDA)
    set(CRL_CUDA_ENABLED ON)
  elseif(CMAKE_CUDA_COMPILER)
    message(STATUS "CUDA toolkit found but libtorch has no CUDA: building the CPU path only")
  endif()
endif()
message(STATUS "colocated-rl: CUDA kernels ${CRL_CUDA_ENABLED}")

# crl_add_cuda_sources(<target> <files...>): appended only when CUDA is enabled (CRL_WITH_CUDA is
# then defined for every module by crl_common, common/CMakeLists.txt).
function(crl_add_cuda_sources target)
  if(CRL_CUDA_ENABLED)
    target_sources(${target} PRIVATE ${ARGN})
    set_target_properties(${target} PROPERTIES CUDA_ARCHITECTURES "80;90")
  endif()
endfunction()
