// SPDX-License-Identifier: Apache-2.0
// The fast precision on AVX-512 CPUs with AVX512-BF16 dot products and no AMX (Zen 4, Cooper
// Lake; any AMX CPU when DG_CPU_ISA=avx512): activations rounded to bf16 (round to nearest even,
// as the AMX path rounds them), each instruction adding two bf16 products per fp32 lane, so a
// register tile does twice the multiply-adds of the fp32 tile per instruction.
//
// The weights are the pair tiles packed at load (operands.hpp): a pair of k for 16 outputs is one
// 64-byte vector, exactly the operand the dot product takes, so the tile reads them in place with
// no panel to fill. Every output is one chain of dot products over the pairs of k in order, so its
// value does not depend on the blocking, the thread count or the other rows of the pass.
#pragma once

#include <cstdint>

#include <diffusion_gemma/cpu/isa.hpp>
#include <diffusion_gemma/cpu/kernels/avx512.hpp>
#include <diffusion_gemma/cpu/kernels/operands.hpp>

#if DG_X86_KERNELS

namespace diffusion_gemma::cpu::kernels::avx512_bf16 {

// Pairs of k per row of packed activations.
inline std::int64_t activation_pairs(std::int64_t k) { return (k + 1) / 2; }

DG_BEGIN_TARGET_AVX512BF16

using avx512::lanes;

// x [m, k] fp32 -> out [m, activation_pairs(k)]: pair p of row i holds (bf16(x[i][2p]),
// bf16(x[i][2p + 1])), the second 0 past the end of an odd k.
inline void pack_activations(const float* x, std::int64_t ldx, std::int64_t m, std::int64_t k, std::uint32_t* out) {
  const std::int64_t pairs = activation_pairs(k);
  for (std::int64_t i = 0; i < m; ++i) {
    const float* row = x + i * ldx;
    std::uint16_t* dst = reinterpret_cast<std::uint16_t*>(out + i * pairs);
    for (std::int64_t c = 0; c < 2 * pairs; c += 32) {
      const std::int64_t count = k - c;
      const __m512 lo = _mm512_maskz_loadu_ps(lanes(count), row + c);
      const __m512 hi = _mm512_maskz_loadu_ps(lanes(count - 16), row + c + 16);
      const __m512i v = reinterpret_cast<__m512i>(_mm512_cvtne2ps_pbh(hi, lo));
      const std::int64_t room = 2 * pairs - c;
      const __mmask32 m32 = room >= 32 ? 0xFFFFFFFFu : static_cast<__mmask32>((1ull << room) - 1u);
      _mm512_mask_storeu_epi16(dst + c, m32, v);
    }
  }
}

constexpr int kMr = 12;              // rows of the register tile (24 accumulators)
constexpr int kNr = 32;              // two pair-tile panels
constexpr std::int64_t kKcPairs = 128;  // pairs of k per block: both panels' 16 KiB stay in L1

// C[MR x 32] (+)= A[MR, pairs p0..p0+pc) W^T over the panels `first` and `second` (the same
// pointer when only the first exists; its columns are then masked off).
template <int MR>
inline void micro_kernel(const std::uint32_t* a, std::int64_t lda, const std::uint16_t* first,
                         const std::uint16_t* second, std::int64_t pc, float* c, std::int64_t ldc, bool load_c,
                         std::int64_t nvalid) {
  __m512 c0[MR], c1[MR];
  const __mmask16 m0 = lanes(nvalid), m1 = lanes(nvalid - 16);
#pragma GCC unroll 12
  for (int i = 0; i < MR; ++i) {
    c0[i] = load_c ? _mm512_maskz_loadu_ps(m0, c + i * ldc) : _mm512_setzero_ps();
    c1[i] = load_c ? _mm512_maskz_loadu_ps(m1, c + i * ldc + 16) : _mm512_setzero_ps();
  }
  for (std::int64_t p = 0; p < pc; ++p) {
    const __m512bh b0 = reinterpret_cast<__m512bh>(_mm512_loadu_si512(first + p * 2 * kPairPanelWidth));
    const __m512bh b1 = reinterpret_cast<__m512bh>(_mm512_loadu_si512(second + p * 2 * kPairPanelWidth));
#pragma GCC unroll 12
    for (int i = 0; i < MR; ++i) {
      const __m512bh av = reinterpret_cast<__m512bh>(_mm512_set1_epi32(static_cast<int>(a[i * lda + p])));
      c0[i] = _mm512_dpbf16_ps(c0[i], av, b0);
      c1[i] = _mm512_dpbf16_ps(c1[i], av, b1);
    }
  }
#pragma GCC unroll 12
  for (int i = 0; i < MR; ++i) {
    _mm512_mask_storeu_ps(c + i * ldc, m0, c0[i]);
    _mm512_mask_storeu_ps(c + i * ldc + 16, m1, c1[i]);
  }
}

inline void micro_rows(std::int64_t rows, const std::uint32_t* a, std::int64_t lda, const std::uint16_t* first,
                       const std::uint16_t* second, std::int64_t pc, float* c, std::int64_t ldc, bool load_c,
                       std::int64_t nvalid) {
  switch (rows) {
    case 1: return micro_kernel<1>(a, lda, first, second, pc, c, ldc, load_c, nvalid);
    case 2: return micro_kernel<2>(a, lda, first, second, pc, c, ldc, load_c, nvalid);
    case 3: return micro_kernel<3>(a, lda, first, second, pc, c, ldc, load_c, nvalid);
    case 4: return micro_kernel<4>(a, lda, first, second, pc, c, ldc, load_c, nvalid);
    case 5: return micro_kernel<5>(a, lda, first, second, pc, c, ldc, load_c, nvalid);
    case 6: return micro_kernel<6>(a, lda, first, second, pc, c, ldc, load_c, nvalid);
    case 7: return micro_kernel<7>(a, lda, first, second, pc, c, ldc, load_c, nvalid);
    case 8: return micro_kernel<8>(a, lda, first, second, pc, c, ldc, load_c, nvalid);
    case 9: return micro_kernel<9>(a, lda, first, second, pc, c, ldc, load_c, nvalid);
    case 10: return micro_kernel<10>(a, lda, first, second, pc, c, ldc, load_c, nvalid);
    case 11: return micro_kernel<11>(a, lda, first, second, pc, c, ldc, load_c, nvalid);
    default: return micro_kernel<12>(a, lda, first, second, pc, c, ldc, load_c, nvalid);
  }
}

// C[m, n] (+)= A W^T for a BF16 weight [n, k] packed as pair tiles, starting at the panel of
// output 0, with A packed by pack_activations (row stride activation_pairs(k)).
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
  for (std::int64_t p0 = 0; p0 < pairs; p0 += kKcPairs) {
    const std::int64_t pc = pairs - p0 < kKcPairs ? pairs - p0 : kKcPairs;
    const bool load_c = accumulate || p0 > 0;
    for (std::int64_t n0 = 0; n0 < n; n0 += kNr) {
      const std::int64_t nvalid = n - n0 < kNr ? n - n0 : kNr;
      const std::uint16_t* first = w + static_cast<std::size_t>(n0 / kPairPanelWidth) * panel_stride +
                                   static_cast<std::size_t>(p0 * 2 * kPairPanelWidth);
      const std::uint16_t* second = nvalid > kPairPanelWidth ? first + panel_stride : first;
      for (std::int64_t m0 = 0; m0 < m; m0 += kMr) {
        const std::int64_t rows = m - m0 < kMr ? m - m0 : kMr;
        micro_rows(rows, a + m0 * pairs + p0, pairs, first, second, pc, c + m0 * ldc + n0, ldc, load_c, nvalid);
      }
    }
  }
}

DG_END_TARGET

}  // namespace diffusion_gemma::cpu::kernels::avx512_bf16

#endif  // DG_X86_KERNELS
