// SPDX-License-Identifier: Apache-2.0
// Portable kernels: any CPU, any compiler flags. The product widens blocks of B to fp32 and lets
// Eigen's coefficient-based product take dot products of contiguous rows (vectorised with
// whatever SIMD the translation unit was compiled for: SSE2, NEON, ...). Eigen's blocked GEMM is
// not used: it may start its own OpenMP threads, and its blocking (hence rounding) would then
// depend on the thread count. The element-wise functions are the scalar definitions of
// core/math.hpp, which the vector paths reproduce bit for bit.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>

#include <Eigen/Core>

#include <diffusion_gemma/core/math.hpp>
#include <diffusion_gemma/cpu/kernels/operands.hpp>

namespace diffusion_gemma::cpu::kernels::generic {

inline void gemm(const Gemm& g) {
  using RowMatrix = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
  using ConstMap = Eigen::Map<const RowMatrix, Eigen::Unaligned, Eigen::OuterStride<>>;
  using Map = Eigen::Map<RowMatrix, Eigen::Unaligned, Eigen::OuterStride<>>;
  if (g.m <= 0 || g.n <= 0) return;
  constexpr std::int64_t kBlock = 16;
  float* wide = scratch<float, 0>(static_cast<std::size_t>(kBlock * std::max<std::int64_t>(g.k, 1)));
  const ConstMap a(g.a, g.m, g.k, Eigen::OuterStride<>(g.lda));
  for (std::int64_t n0 = 0; n0 < g.n; n0 += kBlock) {
    const std::int64_t nb = std::min(kBlock, g.n - n0);
    for (std::int64_t j = 0; j < nb; ++j)
      for (std::int64_t k = 0; k < g.k; ++k) wide[j * g.k + k] = g.b.at(k, n0 + j);
    const ConstMap b(wide, nb, g.k, Eigen::OuterStride<>(std::max<std::int64_t>(g.k, 1)));
    Map c(g.c + n0, g.m, nb, Eigen::OuterStride<>(g.ldc));
    if (g.accumulate) {
      c.noalias() += a.lazyProduct(b.transpose());
    } else {
      c.noalias() = a.lazyProduct(b.transpose());
    }
  }
}

inline void gelu_mul(float* g, const float* u, std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i) g[i] = math::gelu_tanh(g[i]) * u[i];
}

inline float softcap_div_max(float* x, std::int64_t n, float cap, float t, std::int64_t* arg) {
  float m = -INFINITY;
  std::int64_t a = 0;
  for (std::int64_t i = 0; i < n; ++i) {
    const float l = math::softcap(x[i], cap) / t;
    x[i] = l;
    if (l > m) {
      m = l;
      a = i;
    }
  }
  *arg = a;
  return m;
}

inline void exp_shift_sums(float* x, std::int64_t n, float m, std::int64_t chunk, float* sum, float* weighted,
                           float* chunk_sums) {
  float s = 0.0f, w = 0.0f;
  for (std::int64_t c0 = 0, c = 0; c0 < n; c0 += chunk, ++c) {
    const std::int64_t c1 = std::min(c0 + chunk, n);
    float cs = 0.0f;
    for (std::int64_t i = c0; i < c1; ++i) {
      const float d = x[i] - m;
      const float e = math::exp_approx(d);
      x[i] = e;
      cs += e;
      if (e > 0.0f) w += e * d;
    }
    s += cs;
    if (chunk_sums != nullptr) chunk_sums[c] = cs;
  }
  *sum = s;
  *weighted = w;
}

inline void softmax_row(float* x, std::int64_t n) {
  float m = -INFINITY;
  for (std::int64_t i = 0; i < n; ++i) m = std::max(m, x[i]);
  float sum = 0.0f;
  for (std::int64_t i = 0; i < n; ++i) {
    x[i] = math::exp_approx(x[i] - m);
    sum += x[i];
  }
  const float inv = 1.0f / sum;
  for (std::int64_t i = 0; i < n; ++i) x[i] *= inv;
}

inline void mask_row(float* x, const std::uint8_t* visible, std::int64_t n) {
  for (std::int64_t j = 0; j < n; ++j)
    if (visible[j] == 0) x[j] = -INFINITY;
}
inline void add_row(float* x, const float* y, std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i) x[i] += y[i];
}
inline void add_scale_row(float* x, const float* y, float s, std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i) x[i] = (x[i] + y[i]) * s;
}
inline void add_weighted_row(float* x, const float* y, float w, std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i) x[i] += y[i] * w;
}
inline void mul_scale_row(float* x, const float* w, float s, std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i) x[i] = (x[i] * w[i]) * s;
}

inline void rms_norm_row(const float* x, const float* weight, std::int64_t n, float eps, float* out) {
  math::rms_norm_row(x, weight, static_cast<int>(n), eps, out);
}

}  // namespace diffusion_gemma::cpu::kernels::generic
