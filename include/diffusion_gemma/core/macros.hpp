// SPDX-License-Identifier: Apache-2.0
// The only macros of the library. Per-element math is written once and compiled for the host
// and, under nvcc, for the device too: that is what DG_HOST_DEVICE marks.
#pragma once

#if defined(__CUDACC__)
#define DG_HOST_DEVICE __host__ __device__ __forceinline__
#define DG_DEVICE __device__ __forceinline__
#else
#define DG_HOST_DEVICE inline
#define DG_DEVICE inline
#endif

#if defined(__CUDA_ARCH__)
#define DG_ASSERT(cond) ((void)0)
#else
#include <cassert>
#define DG_ASSERT(cond) assert(cond)
#endif
