// SPDX-License-Identifier: Apache-2.0
// The fast precision on AVX-512 CPUs with AVX512-BF16 dot products and no AMX (Zen 4, Cooper
// Lake; any AMX CPU when DG_CPU_ISA=avx512): activations rounded to bf16 (round to nearest even,
// as the AMX path rounds them), each instruction adding two bf16 products per fp32 lane, so a
// register tile does twice the multiply-adds of the fp32 tile per instruction.
//
// Three products:
//   gemm_pairs  y = x W^T from the pair tiles packed at load (operands.hpp): a pair of k for 16
//               outputs is one 64-byte vector, exactly the operand the dot product takes, so the
//               tile reads them in place with no panel to fill (projections, MLP, experts).
//   xwt         y = x W^T from a row-major W (the LM head over the embedding, which keeps its rows
//               for the lookup): the lanes run over 16 rows of x, packed once as pair tiles, and
//               each pair of a W row is broadcast; the result is y^T, transposed on the way out.
//   xw          y = x B from a row-major B [k, n] (the soft embedding P E): pair tiles of B^T are
//               built per 32 columns by interleaving pairs of B rows, then gemm_pairs runs.
// Every output is one chain of dot products over the pairs of k in order, so its value does not
// depend on the blocking, the thread count or the other rows of the pass.
//
// The operand layouts are the AMX kernels' (amx.hpp uses the packing helpers below): both bf16
// back-ends of the fast precision round the same values the same way.
#pragma once

#include <cstdint>
#include <cstring>

#include <diffusion_gemma/cpu/isa.hpp>
#include <diffusion_gemma/cpu/kernels/avx512.hpp>
#include <diffusion_gemma/cpu/kernels/operands.hpp>

#if DG_X86_KERNELS

namespace diffusion_gemma::cpu::kernels::avx512_bf16 {

// Pairs of k per row of packed activations.
inline std::int64_t activation_pairs(std::int64_t k) { return (k + 1) / 2; }

DG_BEGIN_TARGET_AVX512BF16

using avx512::lanes;

// 32 consecutive elements (the first `count`, the rest 0) as 32 bf16 in one vector.
template <DType T>
inline __m512i load_bf16x32(const std::byte* p, std::int64_t count) {
  using avx512::lanes;
  if constexpr (T == DType::kBF16) {
    const __mmask32 m = count >= 32 ? 0xFFFFFFFFu : count <= 0 ? 0u : static_cast<__mmask32>((1ull << count) - 1u);
    return _mm512_maskz_loadu_epi16(m, p);
  } else {
    const __m512 lo = avx512::load_widen<T>(p, count);
    const __m512 hi = count > 16 ? avx512::load_widen<T>(p + 16 * dtype_size(T), count - 16) : _mm512_setzero_ps();
    return reinterpret_cast<__m512i>(_mm512_cvtne2ps_pbh(hi, lo));
  }
}

// 16 consecutive elements as bf16, each in the low half of a 32-bit lane.
template <DType T>
inline __m512i load_bf16x16_wide(const std::byte* p, std::int64_t count) {
  if constexpr (T == DType::kBF16) {
    return _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(avx512::lanes(count), p));
  } else {
    const __m256bh h = _mm512_cvtneps_pbh(avx512::load_widen<T>(p, count));
    return _mm512_cvtepu16_epi32(reinterpret_cast<const __m256i&>(h));
  }
}

// x [m, k] fp32 -> pair tiles of 16 rows (AMX's B operand; the panels xwt reads): tile (mb, kb)
// holds, in row p and 32-bit column t, the pair (x[16 mb + t][32 kb + 2p], x[16 mb + t][32 kb +
// 2p + 1]); zeros outside x. Panel mb starts pair_panel_elements(k) elements after panel mb - 1.
inline void pack_activations_pairs(const float* x, std::int64_t ldx, std::int64_t m, std::int64_t k,
                                   std::uint16_t* out) {
  const std::int64_t mb_count = (m + 15) / 16, kb_count = (k + 31) / 32;
  for (std::int64_t mb = 0; mb < mb_count; ++mb) {
    for (std::int64_t kb = 0; kb < kb_count; ++kb) {
      __m512 r[16];
      for (int t = 0; t < 16; ++t) {
        const std::int64_t row = mb * 16 + t;
        r[t] = row < m ? _mm512_castsi512_ps(load_bf16x32<DType::kF32>(
                             reinterpret_cast<const std::byte*>(x + row * ldx + kb * 32), k - kb * 32))
                       : _mm512_setzero_ps();
      }
      avx512::transpose16(r);
      std::uint16_t* tile = out + (mb * kb_count + kb) * 512;
      for (int p = 0; p < 16; ++p) _mm512_storeu_ps(reinterpret_cast<float*>(tile + p * 32), r[p]);
    }
  }
}

// y[t][n0 + i] (+)= tile[i][t] for i < ni, t < nt (tile: 16 x 16 fp32, rows = output columns).
inline void store_transposed(const float* tile, std::int64_t ni, std::int64_t nt, float* y, std::int64_t ldy,
                             bool accumulate) {
  __m512 r[16];
  for (int i = 0; i < 16; ++i) r[i] = _mm512_loadu_ps(tile + i * 16);
  avx512::transpose16(r);
  const __mmask16 m = avx512::lanes(ni);
  for (std::int64_t t = 0; t < nt; ++t) {
    float* dst = y + t * ldy;
    const __m512 v = accumulate ? _mm512_add_ps(_mm512_maskz_loadu_ps(m, dst), r[t]) : r[t];
    _mm512_mask_storeu_ps(dst, m, v);
  }
}

// One B tile from B [k, n] rows (BForm::kKN): row p, 32-bit column j holds (B[32 kb + 2p][c0 + j],
// B[32 kb + 2p + 1][c0 + j]); zeros outside B.
template <DType T>
inline void build_pair_tile(const MatrixB& b, std::int64_t k, std::int64_t n, std::int64_t kb, std::int64_t c0,
                            std::uint16_t* tile) {
  const std::int64_t count = n - c0 < 16 ? n - c0 : 16;
  const std::size_t off = static_cast<std::size_t>(c0) * dtype_size(T);
  for (int p = 0; p < 16; ++p) {
    const std::int64_t r0 = kb * 32 + 2 * p;
    const __m512i lo = r0 < k ? load_bf16x16_wide<T>(b.row(r0) + off, count) : _mm512_setzero_si512();
    const __m512i hi = r0 + 1 < k ? load_bf16x16_wide<T>(b.row(r0 + 1) + off, count) : _mm512_setzero_si512();
    _mm512_storeu_si512(tile + p * 32, _mm512_or_si512(lo, _mm512_slli_epi32(hi, 16)));
  }
}

constexpr int kMr = 12;                 // rows of the register tile (24 accumulators)
constexpr int kNr = 32;                 // two pair-tile panels
// Pairs of k per block. A register tile sums a whole block before it stores its accumulators, so
// a deep block saves reloading them (from L3 for a wide output) at every block boundary. The
// block's two panels (64 KiB at 512 pairs) are read from L2, which the dot products' 128 bytes
// per 24 instructions do not strain. Zen 4, medium, 2 threads, against 128 pairs (16 KiB in L1):
// prefill and commit 6-7 % faster, the denoise step 4-7 %; 256 pairs fall in between.
constexpr std::int64_t kKcPairs = 512;

// The register tiles of an m-row product: its rows dealt evenly over the fewest tiles of at most
// kMr (64 rows: 11+11+11+11+10+10, not 5 x 12 + 4), since a tile of few rows has too few chains
// to hide the dot product's latency. The first `extra` tiles have one row more than the others.
struct RowTiles {
  std::int64_t count, base, extra;
  explicit RowTiles(std::int64_t m)
      : count((m + kMr - 1) / kMr), base(count > 0 ? m / count : 0), extra(count > 0 ? m % count : 0) {}
  std::int64_t rows(std::int64_t t) const { return base + (t < extra ? 1 : 0); }
  std::int64_t first_row(std::int64_t t) const { return t * base + (t < extra ? t : extra); }
  std::int64_t tile_of(std::int64_t i) const {
    const std::int64_t wide = extra * (base + 1);
    return i < wide ? i / (base + 1) : extra + (i - wide) / base;
  }
};

// Pairs per group of the packed activations: a row's 4 pairs are one 16-byte run.
constexpr std::int64_t kGroupPairs = 4;

// x [m, k] fp32 -> m x activation_pairs(k) pairs, (bf16(x[i][2p]), bf16(x[i][2p + 1])) (the
// second 0 past the end of an odd k), in blocks of kKcPairs pairs: the block of pairs [p0, p0 +
// pc) starts at p0 * m, and in it the register tile of rows [r0, r0 + R) (RowTiles) starts at r0 *
// pc and holds its pairs by groups of kGroupPairs, each group's R rows in turn (a short last group
// of g pairs as R runs of g). A tile's broadcasts then walk one buffer in order from one pointer;
// with each row a run of its own (what this replaced) they came from 12 streams 2 KiB apart (six
// lines in each of two L1 sets at a block of 512 pairs) and 12 pointers, more than the registers
// hold. Groups rather than single pairs keep the packing a row at a time (four 16-byte stores per
// 16 pairs, where a transpose per tile packed at half the speed). The dot products and their order
// do not change, so neither do the bits. On a Zen 4, one thread, the product of 128 or 512 rows (k
// 1024) ran 1.04-1.08x faster with the weight requests off on both sides; in alternating rounds
// of the two builds medium's commit ran 1.044x faster (docs/performance.md, "Zen 4, 2026-12-06").
// Rows [i0, i1) of the m rows (threads may pack row ranges of one product side by side).
inline void pack_activation_rows(const float* x, std::int64_t ldx, std::int64_t m, std::int64_t k, std::uint32_t* out,
                                 std::int64_t i0, std::int64_t i1) {
  const std::int64_t pairs = activation_pairs(k);
  const RowTiles tiles(m);
  // A tile's rows block by block, so that the 12 rows' stores into each line of a block (24 KiB
  // at most) come together in L1 (row by row over a long k, each line was fetched again for every
  // row).
  for (std::int64_t t = i0 < i1 ? tiles.tile_of(i0) : 0, end = i0 < i1 ? tiles.tile_of(i1 - 1) + 1 : 0; t < end; ++t) {
    const std::int64_t r0 = tiles.first_row(t), rows = tiles.rows(t);
    const std::int64_t first = i0 > r0 ? i0 : r0, last = i1 < r0 + rows ? i1 : r0 + rows;
    for (std::int64_t p0 = 0; p0 < pairs; p0 += kKcPairs) {
      const std::int64_t pc = pairs - p0 < kKcPairs ? pairs - p0 : kKcPairs;
      std::uint32_t* tile = out + p0 * m + r0 * pc;
      for (std::int64_t i = first; i < last; ++i) {
        for (std::int64_t p = 0; p < pc; p += 16) {  // 16 pairs: 4 groups
          const std::int64_t c = 2 * (p0 + p), count = k - c;
          const float* row = x + i * ldx + c;
          const __m512 lo = _mm512_maskz_loadu_ps(lanes(count), row);
          const __m512 hi = _mm512_maskz_loadu_ps(lanes(count - 16), row + 16);
          const __m512i v = reinterpret_cast<__m512i>(_mm512_cvtne2ps_pbh(hi, lo));
          if (pc - p >= 16) {
            std::uint32_t* dst = tile + p * rows + (i - r0) * kGroupPairs;
            const std::int64_t stride = kGroupPairs * rows;
            _mm_storeu_si128(reinterpret_cast<__m128i*>(dst), _mm512_castsi512_si128(v));
            _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + stride), _mm512_extracti32x4_epi32(v, 1));
            _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + 2 * stride), _mm512_extracti32x4_epi32(v, 2));
            _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + 3 * stride), _mm512_extracti32x4_epi32(v, 3));
            continue;
          }
          alignas(64) std::uint32_t lanes16[16];
          _mm512_store_si512(lanes16, v);
          for (std::int64_t g = p; g < pc; g += kGroupPairs) {  // the block's last groups, the last maybe short
            const std::int64_t width = pc - g < kGroupPairs ? pc - g : kGroupPairs;
            std::uint32_t* dst = tile + g * rows + (i - r0) * width;
            for (std::int64_t q = 0; q < width; ++q) dst[q] = lanes16[g - p + q];
          }
        }
      }
    }
  }
}
inline void pack_activations(const float* x, std::int64_t ldx, std::int64_t m, std::int64_t k, std::uint32_t* out) {
  pack_activation_rows(x, ldx, m, k, out, 0, m);
}


// C[MR x 32] (+)= A[MR, pairs p0..p0+pc) W^T over the panels `first` and `second` (the same
// pointer when only the first exists; its columns are then masked off), A one tile as
// pack_activation_rows lays it out (groups of kGroupPairs pairs, each group's MR rows in turn).
// Every 8 pairs it takes `dose` lines of `prefetch` (none when nullptr).
template <int MR>
inline void micro_kernel(const std::uint32_t* a, const std::uint16_t* first,
                         const std::uint16_t* second, std::int64_t pc, float* c, std::int64_t ldc, bool load_c,
                         std::int64_t nvalid, PanelPrefetcher* prefetch, std::int64_t dose) {
  __m512 c0[MR], c1[MR];
  const __mmask16 m0 = lanes(nvalid), m1 = lanes(nvalid - 16);
#pragma GCC unroll 12
  for (int i = 0; i < MR; ++i) {
    c0[i] = load_c ? _mm512_maskz_loadu_ps(m0, c + i * ldc) : _mm512_setzero_ps();
    c1[i] = load_c ? _mm512_maskz_loadu_ps(m1, c + i * ldc + 16) : _mm512_setzero_ps();
  }
  const auto step = [&](std::int64_t p, const std::uint32_t* ap, std::int64_t width) {
    const __m512bh b0 = reinterpret_cast<__m512bh>(_mm512_loadu_si512(first + p * 2 * kPairPanelWidth));
    const __m512bh b1 = reinterpret_cast<__m512bh>(_mm512_loadu_si512(second + p * 2 * kPairPanelWidth));
#pragma GCC unroll 12
    for (int i = 0; i < MR; ++i) {
      const __m512bh av = reinterpret_cast<__m512bh>(_mm512_set1_epi32(static_cast<int>(ap[i * width])));
      c0[i] = _mm512_dpbf16_ps(c0[i], av, b0);
      c1[i] = _mm512_dpbf16_ps(c1[i], av, b1);
    }
  };
  const std::int64_t whole = pc / kGroupPairs * kGroupPairs;
  for (std::int64_t g = 0; g < whole; g += kGroupPairs) {
    const std::uint32_t* ap = a + g * MR;
#pragma GCC unroll 4
    for (int q = 0; q < kGroupPairs; ++q) step(g + q, ap + q, kGroupPairs);
    if ((g & 7) == 4 && prefetch != nullptr) prefetch->take(dose);
  }
  for (std::int64_t p = whole; p < pc; ++p) step(p, a + whole * MR + (p - whole), pc - whole);
#pragma GCC unroll 12
  for (int i = 0; i < MR; ++i) {
    _mm512_mask_storeu_ps(c + i * ldc, m0, c0[i]);
    _mm512_mask_storeu_ps(c + i * ldc + 16, m1, c1[i]);
  }
}

inline void micro_rows(std::int64_t rows, const std::uint32_t* a, const std::uint16_t* first,
                       const std::uint16_t* second, std::int64_t pc, float* c, std::int64_t ldc, bool load_c,
                       std::int64_t nvalid, PanelPrefetcher* prefetch, std::int64_t dose) {
  switch (rows) {
    case 1: return micro_kernel<1>(a, first, second, pc, c, ldc, load_c, nvalid, prefetch, dose);
    case 2: return micro_kernel<2>(a, first, second, pc, c, ldc, load_c, nvalid, prefetch, dose);
    case 3: return micro_kernel<3>(a, first, second, pc, c, ldc, load_c, nvalid, prefetch, dose);
    case 4: return micro_kernel<4>(a, first, second, pc, c, ldc, load_c, nvalid, prefetch, dose);
    case 5: return micro_kernel<5>(a, first, second, pc, c, ldc, load_c, nvalid, prefetch, dose);
    case 6: return micro_kernel<6>(a, first, second, pc, c, ldc, load_c, nvalid, prefetch, dose);
    case 7: return micro_kernel<7>(a, first, second, pc, c, ldc, load_c, nvalid, prefetch, dose);
    case 8: return micro_kernel<8>(a, first, second, pc, c, ldc, load_c, nvalid, prefetch, dose);
    case 9: return micro_kernel<9>(a, first, second, pc, c, ldc, load_c, nvalid, prefetch, dose);
    case 10: return micro_kernel<10>(a, first, second, pc, c, ldc, load_c, nvalid, prefetch, dose);
    case 11: return micro_kernel<11>(a, first, second, pc, c, ldc, load_c, nvalid, prefetch, dose);
    default: return micro_kernel<12>(a, first, second, pc, c, ldc, load_c, nvalid, prefetch, dose);
  }
}

// Where the weights of one block of gemm_pairs lie: pairs [p0, p0 + kKcPairs) of the panels of
// outputs n0 and n0 + 16 (when there is a second), one run each.
inline PanelSource pair_block_source(const std::uint16_t* w, std::int64_t n, std::int64_t k, std::int64_t n0,
                                     std::int64_t p0) {
  const std::int64_t pairs = activation_pairs(k), pc = pairs - p0 < kKcPairs ? pairs - p0 : kKcPairs;
  const std::size_t panel_stride = pair_panel_elements(k);
  const std::uint16_t* first = w + static_cast<std::size_t>(n0 / kPairPanelWidth) * panel_stride +
                               static_cast<std::size_t>(p0 * 2 * kPairPanelWidth);
  return PanelSource{reinterpret_cast<const std::byte*>(first), n - n0 > kPairPanelWidth ? 2 : 1,
                     static_cast<std::size_t>(pc) * 2 * kPairPanelWidth * sizeof(std::uint16_t),
                     panel_stride * sizeof(std::uint16_t)};
}

// C[m, n] (+)= A W^T for a weight [n, k] packed as pair tiles, starting at the panel of output 0,
// with A packed by pack_activations.
inline void gemm_pairs(const std::uint16_t* w, const std::uint32_t* a, std::int64_t m, std::int64_t n, std::int64_t k,
                       float* c, std::int64_t ldc, bool accumulate) {
  if (m <= 0 || n <= 0) return;
  const std::int64_t pairs = activation_pairs(k);
  const std::size_t panel_stride = pair_panel_elements(k);
  if (k == 0) {
    if (!accumulate)
      for (std::int64_t i = 0; i < m; ++i)
        for (std::int64_t j = 0; j < n; ++j) c[i * ldc + j] = 0.0f;
    return;
  }
  const RowTiles row_tiles(m);
  const std::int64_t tiles = row_tiles.count;
  const std::int64_t blocks = (n + kNr - 1) / kNr;
  PanelPrefetcher prefetch;
  for (std::int64_t p0 = 0; p0 < pairs; p0 += kKcPairs) {
    const std::int64_t pc = pairs - p0 < kKcPairs ? pairs - p0 : kKcPairs;
    const bool load_c = accumulate || p0 > 0;
    const std::uint32_t* block = a + p0 * m;
    for (std::int64_t n0 = 0; n0 < n; n0 += kNr) {
      const std::int64_t nvalid = n - n0 < kNr ? n - n0 : kNr;
      const std::uint16_t* first = w + static_cast<std::size_t>(n0 / kPairPanelWidth) * panel_stride +
                                   static_cast<std::size_t>(p0 * 2 * kPairPanelWidth);
      const std::uint16_t* second = nvalid > kPairPanelWidth ? first + panel_stride : first;
      const std::int64_t ahead = n0 / kNr + kPrefetchAhead, next_p0 = p0 + ahead / blocks * kKcPairs;
      // The weights of the block kPrefetchAhead ahead are requested while this one is computed, as
      // the fp32 families request theirs (operands.hpp: blocked_product).
      // Each tile's share is taken a few lines every 8 pairs, between the dot products.
      prefetch.start(next_p0 < pairs ? pair_block_source(w, n, k, ahead % blocks * kNr, next_p0) : PanelSource{}, tiles);
      const std::int64_t doses = pc / 8, dose = doses > 0 ? (prefetch.per_step() + doses - 1) / doses : 0;
      for (std::int64_t t = 0, m0 = 0; t < tiles; ++t) {
        const std::int64_t rows = row_tiles.rows(t);
        if (doses == 0) prefetch.step();
        micro_rows(rows, block + m0 * pc, first, second, pc, c + m0 * ldc + n0, ldc, load_c, nvalid,
                   dose > 0 ? &prefetch : nullptr, dose);
        m0 += rows;
      }
    }
  }
}

// ---- xwt: y = x W^T with W row-major ----

constexpr int kWr = 8;  // rows of W per register tile (x 32 rows of x: 16 accumulators)

inline std::uint32_t load_pair(const std::uint32_t* p) {
  std::uint32_t v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

// t0[i][j] = sum_p w[i][p] . x0[p][j] (and t1 from x1 when TWO), i < 8, j < 16: one 16 x 16
// tile's rows 8 h .. 8 h + 7 per panel of x (w[i]: a row of W as pairs; x: a panel of pair tiles).
template <bool TWO>
inline void wt_tile(const std::uint32_t* const w[kWr], const std::uint32_t* x0, const std::uint32_t* x1,
                    std::int64_t pairs, float* t0, float* t1) {
  __m512 c0[kWr], c1[kWr];
#pragma GCC unroll 8
  for (int i = 0; i < kWr; ++i) {
    c0[i] = _mm512_setzero_ps();
    c1[i] = _mm512_setzero_ps();
  }
  for (std::int64_t p = 0; p < pairs; ++p) {
    const __m512bh b0 = reinterpret_cast<__m512bh>(_mm512_loadu_si512(x0 + p * kPairPanelWidth));
    const __m512bh b1 = TWO ? reinterpret_cast<__m512bh>(_mm512_loadu_si512(x1 + p * kPairPanelWidth)) : b0;
#pragma GCC unroll 8
    for (int i = 0; i < kWr; ++i) {
      const __m512bh av = reinterpret_cast<__m512bh>(_mm512_set1_epi32(static_cast<int>(load_pair(w[i] + p))));
      c0[i] = _mm512_dpbf16_ps(c0[i], av, b0);
      if (TWO) c1[i] = _mm512_dpbf16_ps(c1[i], av, b1);
    }
  }
#pragma GCC unroll 8
  for (int i = 0; i < kWr; ++i) {
    _mm512_storeu_ps(t0 + i * 16, c0[i]);
    if (TWO) _mm512_storeu_ps(t1 + i * 16, c1[i]);
  }
}

// y[m, n] (+)= x W^T for W [n, k] (BForm::kNK, any dtype: BF16 rows are read in place when k is
// even, others rounded to bf16 16 rows at a time), from x packed by pack_activations_pairs.
// Blocks of 16 rows of W (L1/L2) meet every panel of x in turn, so W is read once.
template <DType T>
inline void xwt(const MatrixB& w, const std::uint16_t* xp, std::int64_t m, std::int64_t k, std::int64_t n, float* y,
                std::int64_t ldy, bool accumulate) {
  if (m <= 0 || n <= 0) return;
  const std::int64_t pairs = activation_pairs(k), mb_count = (m + 15) / 16;
  const std::size_t panel = pair_panel_elements(k) / 2;  // in pairs
  const auto* x = reinterpret_cast<const std::uint32_t*>(xp);
  const bool direct = T == DType::kBF16 && k % 2 == 0;  // odd k: a row's last pair would run into the next row
  std::uint32_t* staged = direct ? nullptr : scratch<std::uint32_t, 3>(static_cast<std::size_t>(16 * pairs));
  alignas(64) float tiles[2][256] = {};
  for (std::int64_t n0 = 0; n0 < n; n0 += 16) {
    const std::int64_t rows = n - n0 < 16 ? n - n0 : 16;
    const std::uint32_t* wr[16];
    for (std::int64_t i = 0; i < 16; ++i) {
      const std::int64_t r = i < rows ? i : rows - 1;  // rows past W repeat its last one; never stored
      if (direct) {
        wr[i] = reinterpret_cast<const std::uint32_t*>(w.row(n0 + r));
      } else {
        if (i < rows) {
          auto* dst = reinterpret_cast<std::uint16_t*>(staged + i * pairs);
          for (std::int64_t c = 0; c < 2 * pairs; c += 32) {
            const __m512i v = load_bf16x32<T>(w.row(n0 + i) + static_cast<std::size_t>(c) * dtype_size(T), k - c);
            const std::int64_t room = 2 * pairs - c;
            _mm512_mask_storeu_epi16(dst + c, room >= 32 ? 0xFFFFFFFFu : static_cast<__mmask32>((1ull << room) - 1u), v);
          }
        }
        wr[i] = staged + r * pairs;
      }
    }
    for (std::int64_t mb = 0; mb < mb_count; mb += 2) {
      const bool two = mb + 1 < mb_count;
      const std::uint32_t* x0 = x + static_cast<std::size_t>(mb) * panel;
      for (int h = 0; h < (rows > kWr ? 2 : 1); ++h) {
        if (two) wt_tile<true>(wr + kWr * h, x0, x0 + panel, pairs, tiles[0] + 128 * h, tiles[1] + 128 * h);
        else wt_tile<false>(wr + kWr * h, x0, x0, pairs, tiles[0] + 128 * h, tiles[1] + 128 * h);
      }
      for (std::int64_t j = 0; j < (two ? 2 : 1); ++j) {
        const std::int64_t t0 = (mb + j) * 16, nt = m - t0 < 16 ? m - t0 : 16;
        store_transposed(tiles[j], rows, nt, y + t0 * ldy + n0, ldy, accumulate);
      }
    }
  }
}

// ---- xw: y = x B with B row-major ----

constexpr std::int64_t kXwDepth = 1024;
static_assert(kXwDepth / 2 % kKcPairs == 0, "a slab of B must start a block of the packed activations");  // rows of B per pair-tile slab: 2 panels x 512 pairs = 64 KiB

// y[m, n0..n1) (+)= x B for B [k, n] (BForm::kKN, any dtype), x packed by pack_activations; n0 a
// multiple of 32. (kXwDepth / 2 is a multiple of kKcPairs: the pairs of each slab's rows are a
// pack_activations layout of their own, from (k0 / 2) * m.) Per 32 columns and kXwDepth rows of B,
// the pair tiles of B^T are built (rounded to bf16) and every row of x passes over them.
template <DType T>
inline void xw(const MatrixB& b, const std::uint32_t* xa, std::int64_t m, std::int64_t k, std::int64_t n,
               std::int64_t n0, std::int64_t n1, float* y, std::int64_t ldy, bool accumulate) {
  if (m <= 0 || n1 <= n0) return;
  auto* slab = scratch<std::uint16_t, 11>(2 * pair_panel_elements(kXwDepth));
  for (std::int64_t c0 = n0; c0 < n1; c0 += kNr) {
    const std::int64_t cols = n1 - c0 < kNr ? n1 - c0 : kNr;
    for (std::int64_t k0 = 0; k0 < k; k0 += kXwDepth) {
      const std::int64_t kc = k - k0 < kXwDepth ? k - k0 : kXwDepth;
      const std::size_t panel = pair_panel_elements(kc);
      MatrixB part = b;
      part.data = b.row(k0);
      for (std::int64_t kb = 0; kb < (kc + 31) / 32; ++kb) {
        build_pair_tile<T>(part, kc, n, kb, c0, slab + kb * 512);
        if (cols > 16) build_pair_tile<T>(part, kc, n, kb, c0 + 16, slab + panel + kb * 512);
      }
      gemm_pairs(slab, xa + k0 / 2 * m, m, cols, kc, y + c0, ldy, accumulate || k0 > 0);
    }
  }
}

DG_END_TARGET

}  // namespace diffusion_gemma::cpu::kernels::avx512_bf16

#endif  // DG_X86_KERNELS
