// SPDX-License-Identifier: Apache-2.0
// The element-wise work of the CPU back-end that is hot enough to vectorise, dispatched on the
// engine's instruction set like the products (cpu/linear.hpp). The vector versions equal the
// scalar definitions of core/math.hpp lane by lane for exp, tanh and GELU; reductions (maxima,
// sums) differ from a sequential loop only in the order of the sum.
#pragma once

#include <cstdint>

#include <diffusion_gemma/cpu/isa.hpp>
#include <diffusion_gemma/cpu/kernels/avx2.hpp>
#include <diffusion_gemma/cpu/kernels/avx512.hpp>
#include <diffusion_gemma/cpu/kernels/generic.hpp>

namespace diffusion_gemma::cpu::vmath {

// g[i] = gelu_tanh(g[i]) * u[i] (the gated MLPs).
inline void gelu_mul(Isa isa, float* g, const float* u, std::int64_t n) {
#if DG_X86_KERNELS
  if (isa >= Isa::kAvx512) return kernels::avx512::gelu_mul(g, u, n);
  if (isa == Isa::kAvx2) return kernels::avx2::gelu_mul(g, u, n);
#endif
  kernels::generic::gelu_mul(g, u, n);
}

// x[i] = softcap(x[i], cap) / t in place; returns the maximum and its first index.
inline float softcap_div_max(Isa isa, float* x, std::int64_t n, float cap, float t, std::int64_t* arg) {
#if DG_X86_KERNELS
  if (isa >= Isa::kAvx512) return kernels::avx512::softcap_div_max(x, n, cap, t, arg);
  if (isa == Isa::kAvx2) return kernels::avx2::softcap_div_max(x, n, cap, t, arg);
#endif
  return kernels::generic::softcap_div_max(x, n, cap, t, arg);
}

// x[i] = e^(x[i] - m) in place; the sum of e, the sum of e (x - m), and per-`chunk` sums of e.
inline void exp_shift_sums(Isa isa, float* x, std::int64_t n, float m, std::int64_t chunk, float* sum,
                           float* weighted, float* chunk_sums) {
#if DG_X86_KERNELS
  if (isa >= Isa::kAvx512) return kernels::avx512::exp_shift_sums(x, n, m, chunk, sum, weighted, chunk_sums);
  if (isa == Isa::kAvx2) return kernels::avx2::exp_shift_sums(x, n, m, chunk, sum, weighted, chunk_sums);
#endif
  kernels::generic::exp_shift_sums(x, n, m, chunk, sum, weighted, chunk_sums);
}

// Softmax of a row in place (masked entries are -inf).
inline void softmax_row(Isa isa, float* x, std::int64_t n) {
#if DG_X86_KERNELS
  if (isa >= Isa::kAvx512) return kernels::avx512::softmax_row(x, n);
  if (isa == Isa::kAvx2) return kernels::avx2::softmax_row(x, n);
#endif
  kernels::generic::softmax_row(x, n);
}

// RMSNorm of a row (weight may be null: no scale).
inline void rms_norm_row(Isa isa, const float* x, const float* weight, std::int64_t n, float eps, float* out) {
#if DG_X86_KERNELS
  if (isa >= Isa::kAvx512) return kernels::avx512::rms_norm_row(x, weight, n, eps, out);
  if (isa == Isa::kAvx2) return kernels::avx2::rms_norm_row(x, weight, n, eps, out);
#endif
  kernels::generic::rms_norm_row(x, weight, n, eps, out);
}

// x[j] = -inf where visible[j] is 0 (the attention mask), in place.
inline void mask_row(Isa isa, float* x, const std::uint8_t* visible, std::int64_t n) {
#if DG_X86_KERNELS
  if (isa >= Isa::kAvx512) return kernels::avx512::mask_row(x, visible, n);
  if (isa == Isa::kAvx2) return kernels::avx2::mask_row(x, visible, n);
#endif
  kernels::generic::mask_row(x, visible, n);
}

// x[i] += y[i] (residual adds).
inline void add_row(Isa isa, float* x, const float* y, std::int64_t n) {
#if DG_X86_KERNELS
  if (isa >= Isa::kAvx512) return kernels::avx512::add_row(x, y, n);
  if (isa == Isa::kAvx2) return kernels::avx2::add_row(x, y, n);
#endif
  kernels::generic::add_row(x, y, n);
}

// x[i] = (x[i] + y[i]) * s (a residual add and the layer scalar).
inline void add_scale_row(Isa isa, float* x, const float* y, float s, std::int64_t n) {
#if DG_X86_KERNELS
  if (isa >= Isa::kAvx512) return kernels::avx512::add_scale_row(x, y, s, n);
  if (isa == Isa::kAvx2) return kernels::avx2::add_scale_row(x, y, s, n);
#endif
  kernels::generic::add_scale_row(x, y, s, n);
}

// x[i] += y[i] * w, the product rounded first (the experts' weighted sum).
inline void add_weighted_row(Isa isa, float* x, const float* y, float w, std::int64_t n) {
#if DG_X86_KERNELS
  if (isa >= Isa::kAvx512) return kernels::avx512::add_weighted_row(x, y, w, n);
  if (isa == Isa::kAvx2) return kernels::avx2::add_weighted_row(x, y, w, n);
#endif
  kernels::generic::add_weighted_row(x, y, w, n);
}

// x[i] = (x[i] * w[i]) * s (the router's input scaling).
inline void mul_scale_row(Isa isa, float* x, const float* w, float s, std::int64_t n) {
#if DG_X86_KERNELS
  if (isa >= Isa::kAvx512) return kernels::avx512::mul_scale_row(x, w, s, n);
  if (isa == Isa::kAvx2) return kernels::avx2::mul_scale_row(x, w, s, n);
#endif
  kernels::generic::mul_scale_row(x, w, s, n);
}

}  // namespace diffusion_gemma::cpu::vmath
