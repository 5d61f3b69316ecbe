# SPDX-License-Identifier: Apache-2.0
# The CUDA part is optional at every level: the CPU library configures and builds without nvcc.
# diffusion_gemma::cuda exists where a CUDA toolkit is found; our own CUDA tests and examples are
# compiled where nvcc is usable too (compile-only on machines without a GPU).
find_package(CUDAToolkit QUIET)
if(CUDAToolkit_FOUND)
  add_library(diffusion_gemma_cuda INTERFACE)
  add_library(diffusion_gemma::cuda ALIAS diffusion_gemma_cuda)
  set_target_properties(diffusion_gemma_cuda PROPERTIES EXPORT_NAME cuda)
  # DG_CUDA_STATIC_RUNTIME links the CUDA runtime (and cuBLAS, where the toolkit ships its static
  # archive) into each executable, so that scripts/gpu-build.sh can carry binaries to a machine that
  # has only the NVIDIA driver. A toolkit without libcublas_static.a keeps cuBLAS shared.
  option(DG_CUDA_STATIC_RUNTIME "Link the CUDA runtime (and cuBLAS where available) statically" OFF)
  if(DG_CUDA_STATIC_RUNTIME)
    set(CMAKE_CUDA_RUNTIME_LIBRARY Static)
    set(_dg_cublas CUDA::cublas)
    if(TARGET CUDA::cublas_static AND EXISTS "${CUDAToolkit_LIBRARY_DIR}/libcublas_static.a")
      set(_dg_cublas CUDA::cublas_static)
    endif()
    message(STATUS "diffusion_gemma: static CUDA runtime, cuBLAS via ${_dg_cublas}")
    target_link_libraries(diffusion_gemma_cuda INTERFACE diffusion_gemma CUDA::cudart_static ${_dg_cublas})
  else()
    target_link_libraries(diffusion_gemma_cuda INTERFACE diffusion_gemma CUDA::cudart CUDA::cublas)
  endif()
endif()

set(DG_CUDA_ENABLED OFF)
# enable_language(CUDA) applies to the whole project, and only our own .cu targets need it: a
# project that pulls the library in (our tests, examples and benchmarks off) is left alone.
if(NOT DG_CUDA STREQUAL "OFF" AND (DG_BUILD_TESTS OR DG_BUILD_EXAMPLES OR DG_BUILD_BENCHMARKS))
  include(CheckLanguage)
  check_language(CUDA)
  if(CMAKE_CUDA_COMPILER AND TARGET diffusion_gemma::cuda)
    if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES)
      # One architecture keeps the 2-core CI build lean; set -DCMAKE_CUDA_ARCHITECTURES=native
      # (scripts/gpu-check.sh does) or a list for other GPUs.
      set(CMAKE_CUDA_ARCHITECTURES 90)
    endif()
    enable_language(CUDA)
    set(DG_CUDA_ENABLED ON)
  elseif(DG_CUDA STREQUAL "ON")
    message(FATAL_ERROR "DG_CUDA=ON but no usable CUDA compiler/toolkit was found")
  endif()
endif()
message(STATUS "diffusion_gemma: CUDA toolkit ${CUDAToolkit_FOUND}, CUDA targets ${DG_CUDA_ENABLED}")
