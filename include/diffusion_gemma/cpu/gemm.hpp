// SPDX-License-Identifier: Apache-2.0
// fp32 matrix products for the CPU back-end, through Eigen. Outputs are split into fixed-width
// column panels, each a single-threaded Eigen product, spread over threads: the reduction order
// of every output element is then independent of the thread count (Eigen's own threading picks
// its blocking from the thread count, which would not be).
#pragma once

#include <algorithm>
#include <cstdint>

#include <Eigen/Core>

#include <diffusion_gemma/cpu/parallel.hpp>

namespace diffusion_gemma::cpu {

using RowMatrix = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using MatrixMap = Eigen::Map<RowMatrix>;
using ConstMatrixMap = Eigen::Map<const RowMatrix>;
using StridedMap = Eigen::Map<RowMatrix, Eigen::Unaligned, Eigen::OuterStride<>>;
using ConstStridedMap = Eigen::Map<const RowMatrix, Eigen::Unaligned, Eigen::OuterStride<>>;

inline constexpr std::int64_t kGemmPanel = 128;

// C[m, n] (row stride ldc) = A[m, k] (row stride lda) * B[n, k]^T (rows of B contiguous, stride ldb),
// or C += A * B^T when accumulate. This is y = x W^T for a torch Linear weight W [out, in].
inline void gemm_nt(const float* A, std::int64_t lda, const float* B, std::int64_t ldb, float* C, std::int64_t ldc,
                    std::int64_t m, std::int64_t n, std::int64_t k, bool accumulate = false) {
  if (m == 0 || n == 0) return;
  const std::int64_t panels = (n + kGemmPanel - 1) / kGemmPanel;
  const ConstStridedMap a(A, m, k, Eigen::OuterStride<>(lda));
  const auto body = [&](std::int64_t p) {
    const std::int64_t j0 = p * kGemmPanel, nj = std::min(kGemmPanel, n - j0);
    const ConstStridedMap b(B + j0 * ldb, nj, k, Eigen::OuterStride<>(ldb));
    StridedMap c(C + j0, m, nj, Eigen::OuterStride<>(ldc));
    if (accumulate) {
      c.noalias() += a * b.transpose();
    } else {
      c.noalias() = a * b.transpose();
    }
  };
  if (panels == 1 || m * n * k < (1 << 18)) {
    for (std::int64_t p = 0; p < panels; ++p) body(p);
  } else {
    parallel_for(panels, body);
  }
}

// C[m, n] (+)= A[m, k] * B[k, n] with B row-major (stride ldb): e.g. probabilities x embedding rows.
inline void gemm_nn(const float* A, std::int64_t lda, const float* B, std::int64_t ldb, float* C, std::int64_t ldc,
                    std::int64_t m, std::int64_t n, std::int64_t k, bool accumulate = false) {
  if (m == 0 || n == 0) return;
  const std::int64_t panels = (n + kGemmPanel - 1) / kGemmPanel;
  const ConstStridedMap a(A, m, k, Eigen::OuterStride<>(lda));
  const auto body = [&](std::int64_t p) {
    const std::int64_t j0 = p * kGemmPanel, nj = std::min(kGemmPanel, n - j0);
    const ConstStridedMap b(B + j0, k, nj, Eigen::OuterStride<>(ldb));
    StridedMap c(C + j0, m, nj, Eigen::OuterStride<>(ldc));
    if (accumulate) {
      c.noalias() += a * b;
    } else {
      c.noalias() = a * b;
    }
  };
  if (panels == 1 || m * n * k < (1 << 18)) {
    for (std::int64_t p = 0; p < panels; ++p) body(p);
  } else {
    parallel_for(panels, body);
  }
}

}  // namespace diffusion_gemma::cpu
