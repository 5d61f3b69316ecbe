// SPDX-License-Identifier: Apache-2.0
// AVX-512 kernels (16 fp32 lanes): the exact-precision matrix product and the element-wise math.
// Compiled for AVX-512 whatever the translation unit's flags; called only after cpu/isa.hpp has
// found AVX-512 on this CPU.
//
// The product C (+)= A op(B) packs B, converted to fp32 (exactly: BF16 and F16 widen without
// rounding), into panels of 32 columns x kKc rows that live in L1, and runs a 12 x 32 register
// tile over them: every C element is one chain of fused multiply-adds over k in order, so the
// result does not depend on the blocking, the thread count or which columns a thread was given.
// Products with at most 4 rows (autoregressive decoding) stream B once instead, with dot
// products over k (the chain then runs per lane and is summed at the end).
#pragma once

#include <cmath>
#include <cstdint>

#include <diffusion_gemma/core/math.hpp>
#include <diffusion_gemma/cpu/isa.hpp>
#include <diffusion_gemma/cpu/kernels/operands.hpp>

#if DG_X86_KERNELS

namespace diffusion_gemma::cpu::kernels::avx512 {

DG_BEGIN_TARGET_AVX512

using V = __m512;
using M = __mmask16;
using I = __m512i;
constexpr int kWidth = 16;

inline V load(const float* p) { return _mm512_loadu_ps(p); }
inline void store(float* p, V v) { _mm512_storeu_ps(p, v); }
inline void istore(std::int32_t* p, I v) { _mm512_storeu_si512(p, v); }
inline V set1(float f) { return _mm512_set1_ps(f); }
inline V zero() { return _mm512_setzero_ps(); }
inline V add(V a, V b) { return _mm512_add_ps(a, b); }
inline V sub(V a, V b) { return _mm512_sub_ps(a, b); }
inline V mul(V a, V b) { return _mm512_mul_ps(a, b); }
inline V div(V a, V b) { return _mm512_div_ps(a, b); }
inline V max(V a, V b) { return _mm512_max_ps(a, b); }
inline V fmadd(V a, V b, V c) { return _mm512_fmadd_ps(a, b, c); }    // a b + c, one rounding
inline V fnmadd(V a, V b, V c) { return _mm512_fnmadd_ps(a, b, c); }  // c - a b, one rounding
inline V vabs(V a) { return _mm512_abs_ps(a); }
inline V round_even(V a) { return _mm512_roundscale_ps(a, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
// 2^n for integral n in [-126, 127], assembled in the exponent bits.
inline V pow2(V n) {
  const I e = _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23);
  return _mm512_castsi512_ps(e);
}
inline M cmp_le(V a, V b) { return _mm512_cmp_ps_mask(a, b, _CMP_LE_OQ); }
inline M cmp_lt(V a, V b) { return _mm512_cmp_ps_mask(a, b, _CMP_LT_OQ); }
inline M cmp_ge(V a, V b) { return _mm512_cmp_ps_mask(a, b, _CMP_GE_OQ); }
inline M cmp_gt(V a, V b) { return _mm512_cmp_ps_mask(a, b, _CMP_GT_OQ); }
inline M is_nan(V a) { return _mm512_cmp_ps_mask(a, a, _CMP_UNORD_Q); }
inline V select(M m, V if_true, V if_false) { return _mm512_mask_blend_ps(m, if_false, if_true); }
inline I iset1(std::int32_t v) { return _mm512_set1_epi32(v); }
inline I iota() { return _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15); }
inline I iadd(I a, I b) { return _mm512_add_epi32(a, b); }
inline I iselect(M m, I if_true, I if_false) { return _mm512_mask_blend_epi32(m, if_false, if_true); }
// Lanes whose byte p[lane] is 0.
inline M zero_bytes(const std::uint8_t* p) {
  const I v = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  return _mm512_testn_epi32_mask(v, v);
}
inline float reduce_add(V v) { return _mm512_reduce_add_ps(v); }
inline float reduce_max(V v) { return _mm512_reduce_max_ps(v); }
inline double sum_squares_double(const float* x, std::int64_t n) {
  __m512d lo = _mm512_setzero_pd(), hi = _mm512_setzero_pd();
  std::int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const V v = load(x + i);
    const __m512d a = _mm512_cvtps_pd(_mm512_castps512_ps256(v));
    const __m512d b = _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1)));
    lo = _mm512_fmadd_pd(a, a, lo);
    hi = _mm512_fmadd_pd(b, b, hi);
  }
  double s = _mm512_reduce_add_pd(_mm512_add_pd(lo, hi));
  for (; i < n; ++i) s += static_cast<double>(x[i]) * x[i];
  return s;
}

#include <diffusion_gemma/cpu/kernels/vector_math.inl>

// ---- the exact product -------------------------------------------------------------------------

constexpr int kNr = 32;           // panel width: two vectors
constexpr int kMr = 12;           // rows of the register tile (24 accumulators)
constexpr std::int64_t kKc = 256;  // k rows per panel: 32 KiB, resident in L1

inline M lanes(std::int64_t count) {
  return count >= 16 ? static_cast<M>(0xFFFF) : count <= 0 ? static_cast<M>(0) : static_cast<M>((1u << count) - 1u);
}

// 16 consecutive elements from `p` (the first `count`, the rest 0), widened to fp32.
template <DType T>
inline V load_widen(const std::byte* p, std::int64_t count) {
  const M m = lanes(count);
  if constexpr (T == DType::kF32) {
    return _mm512_maskz_loadu_ps(m, p);
  } else if constexpr (T == DType::kBF16) {
    const __m256i h = _mm256_maskz_loadu_epi16(m, p);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
  } else {
    return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, p));
  }
}

// In-register transpose of a 16 x 16 fp32 block: r[i] lane j becomes r[j] lane i.
inline void transpose16(V r[16]) {
  V t[16], u[16];
  for (int i = 0; i < 8; ++i) {
    t[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
  }
  for (int g = 0; g < 4; ++g) {
    u[4 * g + 0] = _mm512_shuffle_ps(t[4 * g], t[4 * g + 2], 0x44);
    u[4 * g + 1] = _mm512_shuffle_ps(t[4 * g], t[4 * g + 2], 0xEE);
    u[4 * g + 2] = _mm512_shuffle_ps(t[4 * g + 1], t[4 * g + 3], 0x44);
    u[4 * g + 3] = _mm512_shuffle_ps(t[4 * g + 1], t[4 * g + 3], 0xEE);
  }
  for (int j = 0; j < 4; ++j) {
    const V a = _mm512_shuffle_f32x4(u[j], u[4 + j], 0x88);
    const V b = _mm512_shuffle_f32x4(u[j], u[4 + j], 0xDD);
    const V c = _mm512_shuffle_f32x4(u[8 + j], u[12 + j], 0x88);
    const V d = _mm512_shuffle_f32x4(u[8 + j], u[12 + j], 0xDD);
    r[j] = _mm512_shuffle_f32x4(a, c, 0x88);
    r[8 + j] = _mm512_shuffle_f32x4(a, c, 0xDD);
    r[4 + j] = _mm512_shuffle_f32x4(b, d, 0x88);
    r[12 + j] = _mm512_shuffle_f32x4(b, d, 0xDD);
  }
}

// panel[k][j] = B(k0 + k, n0 + j) for k < kc, j < 32 (0 for j >= nvalid).
template <DType T>
inline void pack_panel(const MatrixB& b, std::int64_t n0, std::int64_t nvalid, std::int64_t k0, std::int64_t kc,
                       float* panel) {
  const std::size_t es = dtype_size(T);
  if (b.form == BForm::kKN) {
    for (std::int64_t k = 0; k < kc; ++k) {
      const std::byte* row = b.row(k0 + k) + static_cast<std::size_t>(n0) * es;
      store(panel + k * kNr, load_widen<T>(row, nvalid));
      store(panel + k * kNr + 16, nvalid > 16 ? load_widen<T>(row + 16 * es, nvalid - 16) : zero());
    }
    return;
  }
  // [n, k] storage: 16 rows x 16 k at a time, transposed in registers.
  for (int half = 0; half < 2; ++half) {
    const std::int64_t rows = nvalid - 16 * half;
    for (std::int64_t kk = 0; kk < kc; kk += 16) {
      V r[16];
      const std::int64_t count = kc - kk < 16 ? kc - kk : 16;
      for (int i = 0; i < 16; ++i) {
        r[i] = i < rows ? load_widen<T>(b.row(n0 + 16 * half + i) + static_cast<std::size_t>(k0 + kk) * es, count)
                        : zero();
      }
      transpose16(r);
      for (std::int64_t j = 0; j < count; ++j) store(panel + (kk + j) * kNr + 16 * half, r[j]);
    }
  }
}

// C[MR x 32] (+)= A[MR x kc] panel[kc x 32]; only the first `nvalid` columns of C exist.
template <int MR>
inline void micro_kernel(const float* a, std::int64_t lda, const float* panel, std::int64_t kc, float* c,
                         std::int64_t ldc, bool load_c, std::int64_t nvalid) {
  V c0[MR], c1[MR];
  const M m0 = lanes(nvalid), m1 = lanes(nvalid - 16);
#pragma GCC unroll 12
  for (int i = 0; i < MR; ++i) {
    c0[i] = load_c ? _mm512_maskz_loadu_ps(m0, c + i * ldc) : zero();
    c1[i] = load_c ? _mm512_maskz_loadu_ps(m1, c + i * ldc + 16) : zero();
  }
  for (std::int64_t k = 0; k < kc; ++k) {
    const V b0 = _mm512_loadu_ps(panel + k * kNr), b1 = _mm512_loadu_ps(panel + k * kNr + 16);
#pragma GCC unroll 12
    for (int i = 0; i < MR; ++i) {
      const V av = _mm512_set1_ps(a[i * lda + k]);
      c0[i] = _mm512_fmadd_ps(av, b0, c0[i]);
      c1[i] = _mm512_fmadd_ps(av, b1, c1[i]);
    }
  }
#pragma GCC unroll 12
  for (int i = 0; i < MR; ++i) {
    _mm512_mask_storeu_ps(c + i * ldc, m0, c0[i]);
    _mm512_mask_storeu_ps(c + i * ldc + 16, m1, c1[i]);
  }
}

inline void micro_rows(std::int64_t rows, const float* a, std::int64_t lda, const float* panel, std::int64_t kc,
                       float* c, std::int64_t ldc, bool load_c, std::int64_t nvalid) {
  switch (rows) {
    case 1: return micro_kernel<1>(a, lda, panel, kc, c, ldc, load_c, nvalid);
    case 2: return micro_kernel<2>(a, lda, panel, kc, c, ldc, load_c, nvalid);
    case 3: return micro_kernel<3>(a, lda, panel, kc, c, ldc, load_c, nvalid);
    case 4: return micro_kernel<4>(a, lda, panel, kc, c, ldc, load_c, nvalid);
    case 5: return micro_kernel<5>(a, lda, panel, kc, c, ldc, load_c, nvalid);
    case 6: return micro_kernel<6>(a, lda, panel, kc, c, ldc, load_c, nvalid);
    case 7: return micro_kernel<7>(a, lda, panel, kc, c, ldc, load_c, nvalid);
    case 8: return micro_kernel<8>(a, lda, panel, kc, c, ldc, load_c, nvalid);
    case 9: return micro_kernel<9>(a, lda, panel, kc, c, ldc, load_c, nvalid);
    case 10: return micro_kernel<10>(a, lda, panel, kc, c, ldc, load_c, nvalid);
    case 11: return micro_kernel<11>(a, lda, panel, kc, c, ldc, load_c, nvalid);
    default: return micro_kernel<12>(a, lda, panel, kc, c, ldc, load_c, nvalid);
  }
}

// C (+)= A op(B) through the shared blocked loop (operands.hpp) with this family's 12 x 32 tile.
template <class FillPanel, class Source>
inline void gemm_blocked(const float* a, std::int64_t lda, std::int64_t m, std::int64_t n, std::int64_t k, float* c,
                         std::int64_t ldc, bool accumulate, FillPanel&& fill_panel, Source&& source) {
  float* panel = scratch<float, 0>(static_cast<std::size_t>(kKc * kNr));
  blocked_product(
      TileShape{kKc, kNr, kMr}, &micro_rows, a, lda, m, n, k, c, ldc, accumulate,
      [&](std::int64_t n0, std::int64_t nvalid, std::int64_t k0, std::int64_t kc) {
        fill_panel(n0, nvalid, k0, kc, panel);
        return static_cast<const float*>(panel);
      },
      source);
}

template <DType T>
inline void gemm_packed(const Gemm& g) {
  gemm_blocked(
      g.a, g.lda, g.m, g.n, g.k, g.c, g.ldc, g.accumulate,
      [&](std::int64_t n0, std::int64_t nvalid, std::int64_t k0, std::int64_t kc, float* panel) {
        pack_panel<T>(g.b, n0, nvalid, k0, kc, panel);
      },
      [&](std::int64_t n0, std::int64_t nvalid, std::int64_t k0, std::int64_t kc) {
        return matrix_source(g.b, n0, nvalid, k0, kc);
      });
}

// Rows [k0, k0 + kc) of the 32 columns held by two pair-tile panels (operands.hpp; `second` is
// null past the last output), widened to fp32 (exact: a bf16 is the high half of its fp32). k0
// is even; an odd kc also writes row kc (a zero pad), inside the panel buffer.
inline void unpack_pair_panels(const std::uint16_t* first, const std::uint16_t* second, std::int64_t k0,
                               std::int64_t kc, float* panel) {
  const I high_half = _mm512_set1_epi32(static_cast<int>(0xFFFF0000u));
  for (std::int64_t k = 0; k < kc; k += 2) {
    const std::size_t at = static_cast<std::size_t>((k0 + k) * kPairPanelWidth);
    const I lo = _mm512_loadu_si512(first + at);
    const I hi = second != nullptr ? _mm512_loadu_si512(second + at) : _mm512_setzero_si512();
    float* even = panel + k * kNr;
    store(even, _mm512_castsi512_ps(_mm512_slli_epi32(lo, 16)));
    store(even + 16, _mm512_castsi512_ps(_mm512_slli_epi32(hi, 16)));
    store(even + kNr, _mm512_castsi512_ps(_mm512_and_si512(lo, high_half)));
    store(even + kNr + 16, _mm512_castsi512_ps(_mm512_and_si512(hi, high_half)));
  }
}

// C[m, n] (+)= A[m, k] W^T for a BF16 weight packed as pair tiles, starting at the panel of output
// 0. The same blocks and micro-kernel as gemm_packed, so the same bits as the row-major weight.
inline void gemm_pairs(const std::uint16_t* w, const float* a, std::int64_t lda, std::int64_t m, std::int64_t n,
                       std::int64_t k, float* c, std::int64_t ldc, bool accumulate) {
  if (m <= 0 || n <= 0) return;
  const std::size_t panel_stride = pair_panel_elements(k);
  const auto panel_of = [&](std::int64_t n0) { return w + static_cast<std::size_t>(n0 / kPairPanelWidth) * panel_stride; };
  gemm_blocked(
      a, lda, m, n, k, c, ldc, accumulate,
      [&](std::int64_t n0, std::int64_t nvalid, std::int64_t k0, std::int64_t kc, float* panel) {
        unpack_pair_panels(panel_of(n0), nvalid > kPairPanelWidth ? panel_of(n0 + kPairPanelWidth) : nullptr, k0, kc,
                           panel);
      },
      [&](std::int64_t n0, std::int64_t nvalid, std::int64_t k0, std::int64_t kc) {
        // The two panels of a block are one run each, panel_stride elements apart.
        const std::size_t bytes = static_cast<std::size_t>((kc + 1) / 2 * 2 * kPairPanelWidth) * sizeof(std::uint16_t);
        return PanelSource{reinterpret_cast<const std::byte*>(panel_of(n0) + k0 * kPairPanelWidth),
                           nvalid > kPairPanelWidth ? 2 : 1, bytes, panel_stride * sizeof(std::uint16_t)};
      });
}

// Up to 4 rows of A against [n, k] storage: each B row is read once, 4 rows at a time.
template <DType T, int MR>
inline void gemm_few_rows(const Gemm& g) {
  const std::size_t es = dtype_size(T);
  for (std::int64_t n0 = 0; n0 < g.n; n0 += 4) {
    const int nr = g.n - n0 < 4 ? static_cast<int>(g.n - n0) : 4;
    V acc[MR][4];
    for (int i = 0; i < MR; ++i)
      for (int j = 0; j < 4; ++j) acc[i][j] = zero();
    for (std::int64_t k = 0; k < g.k; k += 16) {
      const std::int64_t count = g.k - k < 16 ? g.k - k : 16;
      V w[4];
      for (int j = 0; j < 4; ++j) {
        w[j] = j < nr ? load_widen<T>(g.b.row(n0 + j) + static_cast<std::size_t>(k) * es, count) : zero();
      }
      for (int i = 0; i < MR; ++i) {
        const V x = _mm512_maskz_loadu_ps(lanes(count), g.a + i * g.lda + k);
        for (int j = 0; j < 4; ++j) acc[i][j] = _mm512_fmadd_ps(x, w[j], acc[i][j]);
      }
    }
    for (int i = 0; i < MR; ++i) {
      for (int j = 0; j < nr; ++j) {
        float& out = g.c[i * g.ldc + n0 + j];
        const float s = reduce_add(acc[i][j]);
        out = g.accumulate ? out + s : s;
      }
    }
  }
}

template <DType T>
inline void gemm_typed(const Gemm& g) {
  if (g.few_rows && g.b.form == BForm::kNK && g.m <= 4 && g.k > 0) {
    switch (g.m) {
      case 1: return gemm_few_rows<T, 1>(g);
      case 2: return gemm_few_rows<T, 2>(g);
      case 3: return gemm_few_rows<T, 3>(g);
      case 4: return gemm_few_rows<T, 4>(g);
      default: break;
    }
  }
  gemm_packed<T>(g);
}

// The whole product on the calling thread.
inline void gemm(const Gemm& g) {
  if (g.m <= 0 || g.n <= 0) return;
  switch (g.b.dtype) {
    case DType::kBF16: return gemm_typed<DType::kBF16>(g);
    case DType::kF16: return gemm_typed<DType::kF16>(g);
    default: return gemm_typed<DType::kF32>(g);
  }
}

DG_END_TARGET

}  // namespace diffusion_gemma::cpu::kernels::avx512

#endif  // DG_X86_KERNELS
