// SPDX-License-Identifier: Apache-2.0
// AVX2 + FMA kernels (8 fp32 lanes), for CPUs without AVX-512 (AMD Zen 2/3, older Intel): the
// exact-precision matrix product and the element-wise math, the same algorithms as avx512.hpp at
// half the width (panels of 16 columns, a 6 x 16 register tile). Every C element is the same
// chain of fused multiply-adds over k as on the AVX-512 path, so the two paths agree bit for bit
// on products with more than 4 rows.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#include <diffusion_gemma/core/math.hpp>
#include <diffusion_gemma/cpu/isa.hpp>
#include <diffusion_gemma/cpu/kernels/operands.hpp>

#if DG_X86_KERNELS

namespace diffusion_gemma::cpu::kernels::avx2 {

DG_BEGIN_TARGET_AVX2

using V = __m256;
using M = __m256;  // lane masks are all-ones / all-zeros lanes
using I = __m256i;
constexpr int kWidth = 8;

inline V load(const float* p) { return _mm256_loadu_ps(p); }
inline void store(float* p, V v) { _mm256_storeu_ps(p, v); }
inline void istore(std::int32_t* p, I v) { _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), v); }
inline V set1(float f) { return _mm256_set1_ps(f); }
inline V zero() { return _mm256_setzero_ps(); }
inline V add(V a, V b) { return _mm256_add_ps(a, b); }
inline V sub(V a, V b) { return _mm256_sub_ps(a, b); }
inline V mul(V a, V b) { return _mm256_mul_ps(a, b); }
inline V div(V a, V b) { return _mm256_div_ps(a, b); }
inline V max(V a, V b) { return _mm256_max_ps(a, b); }
inline V fmadd(V a, V b, V c) { return _mm256_fmadd_ps(a, b, c); }
inline V fnmadd(V a, V b, V c) { return _mm256_fnmadd_ps(a, b, c); }
inline V vabs(V a) { return _mm256_andnot_ps(_mm256_set1_ps(-0.0f), a); }
inline V round_even(V a) { return _mm256_round_ps(a, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
inline V pow2(V n) {
  const I e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_castsi256_ps(e);
}
inline M cmp_le(V a, V b) { return _mm256_cmp_ps(a, b, _CMP_LE_OQ); }
inline M cmp_lt(V a, V b) { return _mm256_cmp_ps(a, b, _CMP_LT_OQ); }
inline M cmp_ge(V a, V b) { return _mm256_cmp_ps(a, b, _CMP_GE_OQ); }
inline M cmp_gt(V a, V b) { return _mm256_cmp_ps(a, b, _CMP_GT_OQ); }
inline M is_nan(V a) { return _mm256_cmp_ps(a, a, _CMP_UNORD_Q); }
inline V select(M m, V if_true, V if_false) { return _mm256_blendv_ps(if_false, if_true, m); }
inline I iset1(std::int32_t v) { return _mm256_set1_epi32(v); }
inline I iota() { return _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7); }
inline I iadd(I a, I b) { return _mm256_add_epi32(a, b); }
inline I iselect(M m, I if_true, I if_false) {
  return _mm256_castps_si256(_mm256_blendv_ps(_mm256_castsi256_ps(if_false), _mm256_castsi256_ps(if_true), m));
}
// Lanes whose byte p[lane] is 0.
inline M zero_bytes(const std::uint8_t* p) {
  std::int64_t eight;
  std::memcpy(&eight, p, sizeof eight);
  const I v = _mm256_cvtepu8_epi32(_mm_cvtsi64_si128(eight));
  return _mm256_castsi256_ps(_mm256_cmpeq_epi32(v, _mm256_setzero_si256()));
}
inline float reduce_add(V v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}
inline float reduce_max(V v) {
  __m128 s = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_max_ps(s, _mm_movehl_ps(s, s));
  s = _mm_max_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}
inline double sum_squares_double(const float* x, std::int64_t n) {
  __m256d lo = _mm256_setzero_pd(), hi = _mm256_setzero_pd();
  std::int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256d a = _mm256_cvtps_pd(_mm_loadu_ps(x + i));
    const __m256d b = _mm256_cvtps_pd(_mm_loadu_ps(x + i + 4));
    lo = _mm256_fmadd_pd(a, a, lo);
    hi = _mm256_fmadd_pd(b, b, hi);
  }
  const __m256d t = _mm256_add_pd(lo, hi);
  __m128d s = _mm_add_pd(_mm256_castpd256_pd128(t), _mm256_extractf128_pd(t, 1));
  double r = _mm_cvtsd_f64(_mm_add_sd(s, _mm_unpackhi_pd(s, s)));
  for (; i < n; ++i) r += static_cast<double>(x[i]) * x[i];
  return r;
}

#include <diffusion_gemma/cpu/kernels/vector_math.inl>

// ---- the exact product -------------------------------------------------------------------------

constexpr int kNr = 16;
constexpr int kMr = 6;
constexpr std::int64_t kKc = 256;
static_assert(kNr == kPairPanelWidth && kKc % 32 == 0, "a panel is one pair-tile panel; depth blocks start on a tile");

// 8 consecutive elements widened to fp32 (all 8 must exist; tails go through `load_partial`).
template <DType T>
inline V load_widen(const std::byte* p) {
  if constexpr (T == DType::kF32) {
    return _mm256_loadu_ps(reinterpret_cast<const float*>(p));
  } else if constexpr (T == DType::kBF16) {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
  } else {
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  }
}
template <DType T>
inline V load_partial(const std::byte* p, std::int64_t count) {
  if (count >= 8) return load_widen<T>(p);
  alignas(32) float tmp[8] = {};
  for (std::int64_t i = 0; i < count; ++i) tmp[i] = MatrixB::element(p, T, i);
  return _mm256_load_ps(tmp);
}

inline void transpose8(V r[8]) {
  V t[8], u[8];
  for (int i = 0; i < 4; ++i) {
    t[2 * i] = _mm256_unpacklo_ps(r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm256_unpackhi_ps(r[2 * i], r[2 * i + 1]);
  }
  for (int g = 0; g < 2; ++g) {
    u[4 * g + 0] = _mm256_shuffle_ps(t[4 * g], t[4 * g + 2], 0x44);
    u[4 * g + 1] = _mm256_shuffle_ps(t[4 * g], t[4 * g + 2], 0xEE);
    u[4 * g + 2] = _mm256_shuffle_ps(t[4 * g + 1], t[4 * g + 3], 0x44);
    u[4 * g + 3] = _mm256_shuffle_ps(t[4 * g + 1], t[4 * g + 3], 0xEE);
  }
  for (int j = 0; j < 4; ++j) {
    r[j] = _mm256_permute2f128_ps(u[j], u[4 + j], 0x20);
    r[4 + j] = _mm256_permute2f128_ps(u[j], u[4 + j], 0x31);
  }
}

// Rows [m0, m1) of A over depth [k0, k0 + kc) as this family's tiles read them: the tile of rows
// [m0 + 6t, m0 + 6t + 6) at out + 6t * kc, its element (i, k) at [k * kMr + i] (a last tile of
// fewer rows keeps the stride of 6). A tile's broadcasts then walk one buffer in order, from one
// pointer, where they read 6 rows of L2 lda apart: on a Zen 2 the BF16 pair-tile product of 128
// rows (k 1024, n 1024, one thread, benchmarks/cpu/panel_prefetch) ran at 97 GFLOP/s against
// 90-92, the packing included, and medium's commit and prefill 1.03x and 1.04x faster in
// alternating rounds of the two builds (docs/performance.md, "A laid out for the AVX2 tiles"). The values and the order of the FMAs do not change, so neither do
// the bits. `out` needs 2 floats past the last tile: a full tile stores 8 lanes per depth step,
// the 2 past its 6 rows rewritten by the next.
inline void pack_row_tiles(const float* a, std::int64_t lda, std::int64_t m0, std::int64_t m1, std::int64_t k0,
                           std::int64_t kc, float* out) {
  for (std::int64_t t0 = m0; t0 < m1; t0 += kMr) {
    const std::int64_t rows = m1 - t0 < kMr ? m1 - t0 : kMr;
    const float* src = a + t0 * lda + k0;
    float* dst = out + (t0 - m0) * kc;
    std::int64_t k = 0;
    if (rows == kMr) {
      for (; k + 8 <= kc; k += 8) {
        V r[8];
#pragma GCC unroll 6
        for (int i = 0; i < kMr; ++i) r[i] = load(src + i * lda + k);
        r[6] = r[7] = zero();
        transpose8(r);
#pragma GCC unroll 8
        for (int j = 0; j < 8; ++j) store(dst + (k + j) * kMr, r[j]);
      }
    }
    for (; k < kc; ++k)
      for (std::int64_t i = 0; i < rows; ++i) dst[k * kMr + i] = src[i * lda + k];
  }
}

// blocked_product's pack_rows for this family: a group's block in per-thread scratch.
struct RowTilePacker {
  float* block(std::int64_t rows, std::int64_t kc) const {
    return scratch<float, 17>(static_cast<std::size_t>((rows + kMr - 1) / kMr * kMr * kc + 2));
  }
  void tile(const float* a, std::int64_t lda, std::int64_t m0, std::int64_t m1, std::int64_t k0, std::int64_t kc,
            float* out) const {
    pack_row_tiles(a, lda, m0, m1, k0, kc, out);
  }
};

template <DType T>
inline void pack_panel(const MatrixB& b, std::int64_t n0, std::int64_t nvalid, std::int64_t k0, std::int64_t kc,
                       float* panel) {
  const std::size_t es = dtype_size(T);
  if (b.form == BForm::kKN) {
    for (std::int64_t k = 0; k < kc; ++k) {
      const std::byte* row = b.row(k0 + k) + static_cast<std::size_t>(n0) * es;
      store(panel + k * kNr, load_partial<T>(row, nvalid));
      store(panel + k * kNr + 8, nvalid > 8 ? load_partial<T>(row + 8 * es, nvalid - 8) : zero());
    }
    return;
  }
  for (int half = 0; half < 2; ++half) {
    const std::int64_t rows = nvalid - 8 * half;
    for (std::int64_t kk = 0; kk < kc; kk += 8) {
      V r[8];
      const std::int64_t count = kc - kk < 8 ? kc - kk : 8;
      for (int i = 0; i < 8; ++i) {
        r[i] = i < rows ? load_partial<T>(b.row(n0 + 8 * half + i) + static_cast<std::size_t>(k0 + kk) * es, count)
                        : zero();
      }
      transpose8(r);
      for (std::int64_t j = 0; j < count; ++j) store(panel + (kk + j) * kNr + 8 * half, r[j]);
    }
  }
}

// C[MR x 16] (+)= A[MR x kc] panel, A as pack_row_tiles lays a tile out ([kc][kMr]).
template <int MR>
inline void micro_kernel(const float* a, std::int64_t, const float* panel, std::int64_t kc, float* c,
                         std::int64_t ldc, bool load_c, std::int64_t nvalid) {
  V c0[MR], c1[MR];
  alignas(32) float edge[MR * kNr];
  float* dst = c;
  std::int64_t ld = ldc;
  if (nvalid < kNr) {  // a partial panel goes through a full-width copy of C
    for (int i = 0; i < MR; ++i)
      for (int j = 0; j < kNr; ++j) edge[i * kNr + j] = load_c && j < nvalid ? c[i * ldc + j] : 0.0f;
    dst = edge;
    ld = kNr;
  }
#pragma GCC unroll 6
  for (int i = 0; i < MR; ++i) {
    c0[i] = load_c ? _mm256_loadu_ps(dst + i * ld) : zero();
    c1[i] = load_c ? _mm256_loadu_ps(dst + i * ld + 8) : zero();
  }
  // The depth unrolled by 2. A's MR values of a step are adjacent (pack_row_tiles), so one pointer
  // addresses them all: with one pointer per row of A in place, the row addresses had cost 6-7
  // integer instructions per 12 FMAs, which on Intel share ports 0 and 1 with the FMAs.
  const auto step = [&](std::int64_t k) {
    V b0 = _mm256_loadu_ps(panel + k * kNr), b1 = _mm256_loadu_ps(panel + k * kNr + 8);
    // B stays in two registers. Without this GCC folds its two loads into all 2 x MR FMAs, so a
    // step issues 18 loads for 12 FMAs; a core that loads two vectors per cycle (AMD Zen 2 and 3,
    // Intel before Ice Lake) then waits on loads, not on its two FMA units.
    __asm__("" : "+x"(b0), "+x"(b1));
#pragma GCC unroll 6
    for (int i = 0; i < MR; ++i) {
      const V av = _mm256_broadcast_ss(a + k * kMr + i);
      c0[i] = _mm256_fmadd_ps(av, b0, c0[i]);
      c1[i] = _mm256_fmadd_ps(av, b1, c1[i]);
    }
  };
  std::int64_t k = 0;
  for (; k + 2 <= kc; k += 2) {
    step(k);
    step(k + 1);
  }
  if (k < kc) step(k);
#pragma GCC unroll 6
  for (int i = 0; i < MR; ++i) {
    _mm256_storeu_ps(dst + i * ld, c0[i]);
    _mm256_storeu_ps(dst + i * ld + 8, c1[i]);
  }
  if (nvalid < kNr) {
    for (int i = 0; i < MR; ++i)
      for (std::int64_t j = 0; j < nvalid; ++j) c[i * ldc + j] = edge[i * kNr + j];
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
    default: return micro_kernel<6>(a, lda, panel, kc, c, ldc, load_c, nvalid);
  }
}

// C (+)= A op(B) through the shared blocked loop (operands.hpp) with this family's 6 x 16 tile.
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
      source, RowTilePacker{});
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

// ---- fp32 operands laid out as panels once, read by the tile directly -------------------------

// Lays out all of b (as op(B) of a product with n columns and depth k) at `out`: panel p holds
// columns [16p, 16p + 16) over the whole depth, [k][16] (padding columns zero), the values
// gemm_packed's panels hold, for all depth blocks at once.
inline void pack_panels(const MatrixB& b, std::int64_t n, std::int64_t k, float* out) {
  for (std::int64_t n0 = 0; n0 < n; n0 += kNr) {
    pack_panel<DType::kF32>(b, n0, n - n0 < kNr ? n - n0 : kNr, 0, k, out + static_cast<std::size_t>(n0 * k));
  }
}

// C[m, n] (+)= A[m, k] op(B) for op(B) laid out by pack_panels with depth `depth` (>= k0 + k),
// over depth rows [k0, k0 + k): gemm_packed's blocked loop and tile on the stored panels, so the
// same bits as gemm_packed on b's rows [k0, k0 + k), without packing a panel per call.
inline void gemm_panels(const float* panels, std::int64_t depth, std::int64_t k0, const float* a, std::int64_t lda,
                        std::int64_t m, std::int64_t n, std::int64_t k, float* c, std::int64_t ldc, bool accumulate) {
  if (m <= 0 || n <= 0) return;
  const auto at = [&](std::int64_t n0, std::int64_t kb) {
    return panels + static_cast<std::size_t>(n0 * depth + (k0 + kb) * kNr);
  };
  blocked_product(
      TileShape{kKc, kNr, kMr}, &micro_rows, a, lda, m, n, k, c, ldc, accumulate,
      [&](std::int64_t n0, std::int64_t, std::int64_t kb, std::int64_t) { return at(n0, kb); },
      [&](std::int64_t n0, std::int64_t, std::int64_t kb, std::int64_t kc) {
        return PanelSource{reinterpret_cast<const std::byte*>(at(n0, kb)), 1,
                           static_cast<std::size_t>(kc * kNr) * sizeof(float), 0};
      },
      RowTilePacker{});
}

// ---- BF16 weights packed as pair tiles, read by the tile directly ------------------------------

// Depth per block: a block of a pair-tile panel (512 x 16 bf16, 16 KiB) takes the L1 room of an
// fp32 panel half as deep, so C is loaded and stored half as often, and no panel is written.
constexpr std::int64_t kPairKc = 512;
static_assert(kPairKc % 32 == 0, "depth blocks start on a pair tile");

// C[MR x 16] (+)= A[MR x kc] W for rows [k0, k0 + kc) of one pair-tile panel (operands.hpp), A as
// pack_row_tiles lays a tile out: the pair (k, k + 1) of 16 columns is 64 contiguous bytes, and
// each bf16 is widened in registers (exact: it is the high half of its fp32; the even one is
// shifted up, the odd one has the even one's bits cleared). The FMAs are those of micro_kernel in
// the same order, so the bits are the same as for an fp32 panel. Against unpacking each 256-deep block into an fp32 panel first (what
// this replaced), commit and prefill ran 1.05-1.06x faster on a Zen 2 (docs/design.md, "exact").
template <int MR>
inline void pair_kernel(const float* a, std::int64_t, const std::uint16_t* pairs, std::int64_t kc, float* c,
                        std::int64_t ldc, bool load_c, std::int64_t nvalid) {
  V c0[MR], c1[MR];
  alignas(32) float edge[MR * kNr];
  float* dst = c;
  std::int64_t ld = ldc;
  if (nvalid < kNr) {  // a partial panel goes through a full-width copy of C
    for (int i = 0; i < MR; ++i)
      for (int j = 0; j < kNr; ++j) edge[i * kNr + j] = load_c && j < nvalid ? c[i * ldc + j] : 0.0f;
    dst = edge;
    ld = kNr;
  }
#pragma GCC unroll 6
  for (int i = 0; i < MR; ++i) {
    c0[i] = load_c ? _mm256_loadu_ps(dst + i * ld) : zero();
    c1[i] = load_c ? _mm256_loadu_ps(dst + i * ld + 8) : zero();
  }
  const I high_half = _mm256_set1_epi32(static_cast<int>(0xFFFF0000u));
  // One depth step: 2 x MR FMAs against B's two vectors, which stay in registers (see
  // micro_kernel for why the empty asm is there).
  const auto step = [&](std::int64_t k, V b0, V b1) {
    __asm__("" : "+x"(b0), "+x"(b1));
#pragma GCC unroll 6
    for (int i = 0; i < MR; ++i) {
      const V av = _mm256_broadcast_ss(a + k * kMr + i);
      c0[i] = _mm256_fmadd_ps(av, b0, c0[i]);
      c1[i] = _mm256_fmadd_ps(av, b1, c1[i]);
    }
  };
  const auto pair = [&](std::int64_t k) { return reinterpret_cast<const __m256i*>(pairs + k * kNr); };
  std::int64_t k = 0;
  for (; k + 2 <= kc; k += 2) {
    const I* p = pair(k);
    step(k, _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_loadu_si256(p), 16)),
         _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_loadu_si256(p + 1), 16)));
    step(k + 1, _mm256_castsi256_ps(_mm256_and_si256(_mm256_loadu_si256(p), high_half)),
         _mm256_castsi256_ps(_mm256_and_si256(_mm256_loadu_si256(p + 1), high_half)));
  }
  if (k < kc) {  // an odd depth: the last pair's odd half is padding, and A has no element there
    const I* p = pair(k);
    step(k, _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_loadu_si256(p), 16)),
         _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_loadu_si256(p + 1), 16)));
  }
#pragma GCC unroll 6
  for (int i = 0; i < MR; ++i) {
    _mm256_storeu_ps(dst + i * ld, c0[i]);
    _mm256_storeu_ps(dst + i * ld + 8, c1[i]);
  }
  if (nvalid < kNr) {
    for (int i = 0; i < MR; ++i)
      for (std::int64_t j = 0; j < nvalid; ++j) c[i * ldc + j] = edge[i * kNr + j];
  }
}

inline void pair_rows(std::int64_t rows, const float* a, std::int64_t lda, const std::uint16_t* pairs, std::int64_t kc,
                      float* c, std::int64_t ldc, bool load_c, std::int64_t nvalid) {
  switch (rows) {
    case 1: return pair_kernel<1>(a, lda, pairs, kc, c, ldc, load_c, nvalid);
    case 2: return pair_kernel<2>(a, lda, pairs, kc, c, ldc, load_c, nvalid);
    case 3: return pair_kernel<3>(a, lda, pairs, kc, c, ldc, load_c, nvalid);
    case 4: return pair_kernel<4>(a, lda, pairs, kc, c, ldc, load_c, nvalid);
    case 5: return pair_kernel<5>(a, lda, pairs, kc, c, ldc, load_c, nvalid);
    default: return pair_kernel<6>(a, lda, pairs, kc, c, ldc, load_c, nvalid);
  }
}

// Where the block of rows [k0, k0 + kc) of the panel at `panel` lies (an odd kc includes its pad).
inline PanelSource pair_panel_source(const std::uint16_t* panel, std::int64_t k0, std::int64_t kc) {
  const std::size_t bytes = static_cast<std::size_t>((kc + 1) / 2 * 2 * kNr) * sizeof(std::uint16_t);
  return PanelSource{reinterpret_cast<const std::byte*>(panel + k0 * kNr), 1, bytes, 0};
}

// C[m, n] (+)= A[m, k] W^T for a BF16 weight packed as pair tiles, starting at the panel of output
// 0: the blocked loop of gemm_packed with the tile reading the pairs, so the same bits as the
// row-major weight. `prefetch` off is for benchmarks/cpu/panel_prefetch only.
inline void gemm_pairs(const std::uint16_t* w, const float* a, std::int64_t lda, std::int64_t m, std::int64_t n,
                       std::int64_t k, float* c, std::int64_t ldc, bool accumulate, bool prefetch = true) {
  if (m <= 0 || n <= 0) return;
  const std::size_t panel_stride = pair_panel_elements(k);
  const auto panel_of = [&](std::int64_t n0) { return w + static_cast<std::size_t>(n0 / kNr) * panel_stride; };
  blocked_product(
      TileShape{kPairKc, kNr, kMr}, &pair_rows, a, lda, m, n, k, c, ldc, accumulate,
      [&](std::int64_t n0, std::int64_t, std::int64_t k0, std::int64_t) { return panel_of(n0) + k0 * kNr; },
      [&](std::int64_t n0, std::int64_t, std::int64_t k0, std::int64_t kc) {
        return prefetch ? pair_panel_source(panel_of(n0), k0, kc) : PanelSource{};
      },
      RowTilePacker{});
}

template <DType T, int MR>
inline void gemm_few_rows(const Gemm& g) {
  const std::size_t es = dtype_size(T);
  for (std::int64_t n0 = 0; n0 < g.n; n0 += 4) {
    const int nr = g.n - n0 < 4 ? static_cast<int>(g.n - n0) : 4;
    V acc[MR][4];
    for (int i = 0; i < MR; ++i)
      for (int j = 0; j < 4; ++j) acc[i][j] = zero();
    std::int64_t k = 0;
    for (; k + 8 <= g.k; k += 8) {
      V w[4];
      for (int j = 0; j < 4; ++j) w[j] = j < nr ? load_widen<T>(g.b.row(n0 + j) + static_cast<std::size_t>(k) * es) : zero();
      for (int i = 0; i < MR; ++i) {
        const V x = _mm256_loadu_ps(g.a + i * g.lda + k);
        for (int j = 0; j < 4; ++j) acc[i][j] = _mm256_fmadd_ps(x, w[j], acc[i][j]);
      }
    }
    for (int i = 0; i < MR; ++i) {
      for (int j = 0; j < nr; ++j) {
        float s = reduce_add(acc[i][j]);
        for (std::int64_t kk = k; kk < g.k; ++kk) s += g.a[i * g.lda + kk] * MatrixB::element(g.b.row(n0 + j), T, kk);
        float& out = g.c[i * g.ldc + n0 + j];
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

inline void gemm(const Gemm& g) {
  if (g.m <= 0 || g.n <= 0) return;
  switch (g.b.dtype) {
    case DType::kBF16: return gemm_typed<DType::kBF16>(g);
    case DType::kF16: return gemm_typed<DType::kF16>(g);
    default: return gemm_typed<DType::kF32>(g);
  }
}

DG_END_TARGET

}  // namespace diffusion_gemma::cpu::kernels::avx2

#endif  // DG_X86_KERNELS
