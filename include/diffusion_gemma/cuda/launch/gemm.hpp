// SPDX-License-Identifier: Apache-2.0
// Row-major GEMMs through cuBLAS (column-major underneath: a row-major [m, n] matrix is a
// column-major [n, m] one, so every product is issued transposed). Inputs are BF16 or F32 (both
// operands in the model's storage type), outputs always F32, accumulation CUBLAS_COMPUTE_32F.
// Host code only; never allocates, never synchronises.
#pragma once

#include <climits>
#include <cstdint>

#include <cublas_v2.h>

#include <diffusion_gemma/core/dtype.hpp>
#include <diffusion_gemma/core/status.hpp>
#include <diffusion_gemma/cuda/runtime.hpp>

namespace diffusion_gemma::cuda {

inline Status cuda_data_type(DType t, cudaDataType_t* out) {
  switch (t) {
    case DType::kF32: *out = CUDA_R_32F; return {};
    case DType::kBF16: *out = CUDA_R_16BF; return {};
    default: break;
  }
  return make_status(StatusCode::kUnsupported, "GEMM: operand dtype ", dtype_name(t), " is not BF16 or F32");
}

namespace detail {

inline Status check_gemm_dims(std::int64_t m, std::int64_t n, std::int64_t k, std::int64_t lda, std::int64_t ldb,
                              std::int64_t ldc) {
  for (std::int64_t v : {m, n, k, lda, ldb, ldc}) {
    if (v < 0 || v > INT_MAX) {
      return make_status(StatusCode::kOutOfRange, "GEMM: dimension or leading dimension ", v,
                         " does not fit cuBLAS's int");
    }
  }
  return {};
}

}  // namespace detail

// C[m, n] (row stride ldc) = alpha * A[m, k] (row stride lda) B[n, k]^T (row stride ldb) + beta C.
// This is y = x W^T for a torch Linear weight W [out, in].
inline Status gemm_nt(cublasHandle_t handle, cudaStream_t stream, DType dtype, const void* A, std::int64_t lda,
                      const void* B, std::int64_t ldb, float* C, std::int64_t ldc, std::int64_t m, std::int64_t n,
                      std::int64_t k, float alpha = 1.0f, float beta = 0.0f) {
  if (m == 0 || n == 0) return {};
  Status s = detail::check_gemm_dims(m, n, k, lda, ldb, ldc);
  if (!s.ok()) return s;
  cudaDataType_t t = CUDA_R_32F;
  s = cuda_data_type(dtype, &t);
  if (!s.ok()) return s;
  DG_CUBLAS_TRY(cublasSetStream(handle, stream));
  // Column-major view: C^T [n, m] = B [n, k] (i.e. op = T on the [k, n] view) times A^T [k, m].
  DG_CUBLAS_TRY(cublasGemmEx(handle, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(n), static_cast<int>(m),
                             static_cast<int>(k), &alpha, B, t, static_cast<int>(ldb), A, t, static_cast<int>(lda),
                             &beta, C, CUDA_R_32F, static_cast<int>(ldc), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
  return {};
}

// C[m, n] (row stride ldc) = alpha * A[m, k] (row stride lda) B[k, n] (row stride ldb) + beta C:
// e.g. probabilities [C, V_tile] times embedding rows [V_tile, H].
inline Status gemm_nn(cublasHandle_t handle, cudaStream_t stream, DType dtype, const void* A, std::int64_t lda,
                      const void* B, std::int64_t ldb, float* C, std::int64_t ldc, std::int64_t m, std::int64_t n,
                      std::int64_t k, float alpha = 1.0f, float beta = 0.0f) {
  if (m == 0 || n == 0) return {};
  Status s = detail::check_gemm_dims(m, n, k, lda, ldb, ldc);
  if (!s.ok()) return s;
  cudaDataType_t t = CUDA_R_32F;
  s = cuda_data_type(dtype, &t);
  if (!s.ok()) return s;
  DG_CUBLAS_TRY(cublasSetStream(handle, stream));
  // Column-major view: C^T [n, m] = B^T [n, k] times A^T [k, m], both already in that layout.
  DG_CUBLAS_TRY(cublasGemmEx(handle, CUBLAS_OP_N, CUBLAS_OP_N, static_cast<int>(n), static_cast<int>(m),
                             static_cast<int>(k), &alpha, B, t, static_cast<int>(ldb), A, t, static_cast<int>(lda),
                             &beta, C, CUDA_R_32F, static_cast<int>(ldc), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
  return {};
}

}  // namespace diffusion_gemma::cuda
