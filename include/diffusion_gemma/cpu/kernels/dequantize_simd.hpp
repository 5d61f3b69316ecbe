// SPDX-License-Identifier: Apache-2.0
// Vector forms of cpu/kernels/dequantize.hpp for the compressed-tensors layouts (packed INT4/INT8,
// I8, FP8 decoded in integer lanes), which dequantisation time decides: 16 (AVX-512) or 8 (AVX2) weights per step, with
// the same arithmetic as the scalar form, so the result is the same bits (tests/cpu/kernels_test.cpp
// compares them): (q - zero) as an exact float, times the scale in fp32, rounded to nearest even
// into the scale's dtype. Compiled for their instruction sets whatever the translation unit's
// flags; called only after cpu/isa.hpp has found them.
#pragma once

#include <cstdint>
#include <cstring>
#include <type_traits>

#include <diffusion_gemma/core/quant.hpp>
#include <diffusion_gemma/cpu/isa.hpp>
#include <diffusion_gemma/cpu/kernels/dequantize.hpp>
#include <diffusion_gemma/model/quantized_matrix.hpp>

#if DG_X86_KERNELS

namespace diffusion_gemma::cpu::kernels {

namespace simd_detail {

// Every FP8 E4M3 code as a float, for the scalar tails of the FP8 path.
inline const float* fp8_table() {
  static const auto table = [] {
    struct T {
      float v[256];
    } t{};
    for (int i = 0; i < 256; ++i) t.v[i] = quant::fp8_e4m3_to_float(static_cast<std::uint8_t>(i));
    return t;
  }();
  return table.v;
}

// Where a row's scales and zero points are and how many columns share one.
struct RowGroups {
  std::int64_t width;  // columns per scale
  std::int64_t count;  // scales per row
};

// Index of the scale of (row r, group gi) in weight_scale.
inline std::int64_t scale_index(const QuantizedMatrix& q, const RowGroups& g, std::int64_t r, std::int64_t gi) {
  if (q.group_size < 0) return 0;
  return r * g.count + gi;
}
inline RowGroups row_groups(const QuantizedMatrix& q) {
  if (q.group_size > 0) return {q.group_size, (q.cols + q.group_size - 1) / q.group_size};
  return {q.cols, 1};
}

}  // namespace simd_detail

namespace avx512 {

DG_BEGIN_TARGET_AVX512

// 16 unsigned fields starting at column c of a packed row (c a multiple of 8 for 4 bits).
inline __m512i dq_fields(const std::byte* row, std::int64_t c, int bits) {
  if (bits == 8) return _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(row + c)));
  const __m128i bytes = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(row + c / 2));
  const __m128i lo = _mm_and_si128(bytes, _mm_set1_epi8(0x0F));
  const __m128i hi = _mm_and_si128(_mm_srli_epi16(bytes, 4), _mm_set1_epi8(0x0F));
  return _mm512_cvtepu8_epi32(_mm_unpacklo_epi8(lo, hi));  // even column = low nibble
}

// 16 values rounded to nearest even into S, as 16-bit words (S = BF16 or F16).
template <DType S>
inline __m256i dq_round16(__m512 v) {
  if constexpr (S == DType::kF16) {
    return _mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT);
  } else {
    // Round to nearest even into the upper 16 bits (the values are finite).
    const __m512i u = _mm512_castps_si512(v);
    const __m512i odd = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
    return _mm512_cvtepi32_epi16(_mm512_srli_epi32(_mm512_add_epi32(u, _mm512_add_epi32(odd, _mm512_set1_epi32(0x7fff))), 16));
  }
}

template <DType S>
inline void dq_store(std::byte* out, std::int64_t i, __m512 v) {
  if constexpr (S == DType::kF32) {
    _mm512_storeu_ps(reinterpret_cast<float*>(out) + i, v);
  } else {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + 2 * i), dq_round16<S>(v));
  }
}

// 16 FP8 E4M3 codes as floats, exactly (core/quant.hpp's decoding in integer lanes).
inline __m512 dq_fp8(const std::byte* p) {
  const __m512i b = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  const __m512i sign = _mm512_slli_epi32(_mm512_and_si512(b, _mm512_set1_epi32(0x80)), 24);
  const __m512i e = _mm512_and_si512(_mm512_srli_epi32(b, 3), _mm512_set1_epi32(0xF));
  const __m512i m = _mm512_and_si512(b, _mm512_set1_epi32(0x7));
  const __m512i normal = _mm512_or_si512(
      sign, _mm512_or_si512(_mm512_slli_epi32(_mm512_add_epi32(e, _mm512_set1_epi32(120)), 23), _mm512_slli_epi32(m, 20)));
  const __m512 sub = _mm512_mul_ps(_mm512_cvtepi32_ps(m), _mm512_set1_ps(1.0f / 512.0f));
  const __m512i subnormal = _mm512_or_si512(sign, _mm512_castps_si512(sub));
  __m512i v = _mm512_mask_blend_epi32(_mm512_cmpeq_epi32_mask(e, _mm512_setzero_si512()), normal, subnormal);
  const __mmask16 nan = _mm512_cmpeq_epi32_mask(_mm512_and_si512(b, _mm512_set1_epi32(0x7F)), _mm512_set1_epi32(0x7F));
  v = _mm512_mask_blend_epi32(nan, v, _mm512_or_si512(sign, _mm512_set1_epi32(0x7fc00000)));
  return _mm512_castsi512_ps(v);
}

// The 16 values a 4-bit group can take, (code - zero) * scale rounded into S, as 16-bit words in
// the low half of a register: one vpermw then dequantises 32 weights.
template <DType S>
inline __m512i dq_table16(__m512 vz, __m512 vs) {
  const __m512 codes = _mm512_cvtepi32_ps(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15));
  return _mm512_castsi256_si512(dq_round16<S>(_mm512_mul_ps(_mm512_sub_ps(codes, vz), vs)));
}

// 32 4-bit codes from column c (even) of a packed row, one per 16-bit lane, in column order.
inline __m512i dq_codes32(const std::byte* row, std::int64_t c) {
  const __m128i bytes = _mm_loadu_si128(reinterpret_cast<const __m128i*>(row + c / 2));
  const __m128i lo = _mm_and_si128(bytes, _mm_set1_epi8(0x0F));
  const __m128i hi = _mm_and_si128(_mm_srli_epi16(bytes, 4), _mm_set1_epi8(0x0F));
  const __m256i both = _mm256_set_m128i(_mm_unpackhi_epi8(lo, hi), _mm_unpacklo_epi8(lo, hi));
  return _mm512_cvtepu8_epi16(both);
}

// Rows ahead whose codes are requested while a row is dequantised. The codes are read once, in row
// order, from memory, and without the requests the loop waited on them: perf put a quarter of its
// samples on the instruction after their load (the hardware prefetchers do not cross 4 KiB pages,
// and every matrix, expert by expert, starts a new stream). Measured on the AMX Xeon, medium W4A16
// in paired steps: backbone 0.130 -> 0.117-0.122 s (2 to 16 rows ahead were within noise).
inline constexpr std::int64_t kDequantizeAhead = 4;

// Rows [r0, r0 + n) of a compressed-tensors matrix; returns false (nothing written) for a layout
// this path does not take (then the scalar form runs).
template <DType S>
inline bool dequantize_rows(const QuantizedMatrix& q, std::int64_t r0, std::int64_t n, std::byte* out) {
  const std::int64_t K = q.cols;
  const simd_detail::RowGroups groups = simd_detail::row_groups(q);
  if (groups.width % 16 != 0 && groups.count > 1) return false;
  const bool packed = q.format == QuantFormat::kPacked;
  if (!packed && q.format != QuantFormat::kInt8 && q.format != QuantFormat::kFp8) return false;
  const int bits = packed ? q.bits : 8;
  const std::int64_t row_bytes = packed ? (K * bits + 31) / 32 * 4 : K;
  const float* fp8 = q.format == QuantFormat::kFp8 ? simd_detail::fp8_table() : nullptr;
  for (std::int64_t r = 0; r < n; ++r) {
    const std::int64_t R = r0 + r;
    const std::byte* row = q.values.data + R * row_bytes;
    if (R + kDequantizeAhead < q.rows) {
      const char* ahead = reinterpret_cast<const char*>(row + kDequantizeAhead * row_bytes);
      for (std::int64_t off = 0; off < row_bytes; off += 64) _mm_prefetch(ahead + off, _MM_HINT_T0);
    }
    std::byte* dst = out + r * K * static_cast<std::int64_t>(dtype_size(S));
    for (std::int64_t gi = 0; gi < groups.count; ++gi) {
      const std::int64_t c0 = gi * groups.width, c1 = c0 + groups.width < K ? c0 + groups.width : K;
      const float s = kernels::detail::scale_at<S>(q.scale.data, simd_detail::scale_index(q, groups, R, gi));
      const float zero = packed ? kernels::detail::packed_zero(q, R, gi, groups.count) : 0.0f;
      const __m512 vs = _mm512_set1_ps(s), vz = _mm512_set1_ps(zero);
      std::int64_t c = c0;
      if constexpr (S != DType::kF32) {
        if (packed && bits == 4 && c1 - c0 >= 64) {
          // A group of 4-bit codes: a table of its 16 values and a lookup per 32 weights.
          const __m512i table = dq_table16<S>(vz, vs);
          for (; c + 32 <= c1; c += 32) {
            _mm512_storeu_si512(reinterpret_cast<void*>(dst + 2 * c), _mm512_permutexvar_epi16(dq_codes32(row, c), table));
          }
        }
      }
      for (; c + 16 <= c1; c += 16) {
        __m512 v;
        if (fp8 != nullptr) {
          v = dq_fp8(row + c);
        } else if (!packed) {
          v = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(row + c))));
        } else {
          v = _mm512_sub_ps(_mm512_cvtepi32_ps(dq_fields(row, c, bits)), vz);
        }
        dq_store<S>(dst, c, _mm512_mul_ps(v, vs));
      }
      for (; c < c1; ++c) {
        float v;
        if (fp8 != nullptr) v = fp8[static_cast<std::uint8_t>(row[c])];
        else if (!packed) v = static_cast<float>(static_cast<std::int8_t>(row[c]));
        else v = static_cast<float>(quant::unpack_field(row, c, bits)) - zero;
        kernels::detail::store<S>(dst, c, quant::dequantize(v, s, S));
      }
    }
  }
  return true;
}

DG_END_TARGET

}  // namespace avx512

namespace avx2 {

DG_BEGIN_TARGET_AVX2

// 8 unsigned fields starting at column c of a packed row (c a multiple of 8 for 4 bits).
inline __m256i dq_fields(const std::byte* row, std::int64_t c, int bits) {
  if (bits == 8) return _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(row + c)));
  std::uint32_t w;
  std::memcpy(&w, row + c / 2, 4);
  const __m256i shifts = _mm256_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28);
  return _mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32(static_cast<int>(w)), shifts), _mm256_set1_epi32(0xF));
}

template <DType S>
inline void dq_store(std::byte* out, std::int64_t i, __m256 v) {
  if constexpr (S == DType::kF32) {
    _mm256_storeu_ps(reinterpret_cast<float*>(out) + i, v);
  } else if constexpr (S == DType::kF16) {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + 2 * i), _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT));
  } else {
    const __m256i u = _mm256_castps_si256(v);
    const __m256i odd = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
    const __m256i r = _mm256_srli_epi32(_mm256_add_epi32(u, _mm256_add_epi32(odd, _mm256_set1_epi32(0x7fff))), 16);
    // Pack the 8 low halves in order: packus works per 128-bit lane, the permute joins the lanes.
    const __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(r, r), 0xD8);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + 2 * i), _mm256_castsi256_si128(packed));
  }
}

// 8 FP8 E4M3 codes as floats, exactly.
inline __m256 dq_fp8(const std::byte* p) {
  const __m256i b = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
  const __m256i sign = _mm256_slli_epi32(_mm256_and_si256(b, _mm256_set1_epi32(0x80)), 24);
  const __m256i e = _mm256_and_si256(_mm256_srli_epi32(b, 3), _mm256_set1_epi32(0xF));
  const __m256i m = _mm256_and_si256(b, _mm256_set1_epi32(0x7));
  const __m256i normal = _mm256_or_si256(
      sign, _mm256_or_si256(_mm256_slli_epi32(_mm256_add_epi32(e, _mm256_set1_epi32(120)), 23), _mm256_slli_epi32(m, 20)));
  const __m256 sub = _mm256_mul_ps(_mm256_cvtepi32_ps(m), _mm256_set1_ps(1.0f / 512.0f));
  const __m256i subnormal = _mm256_or_si256(sign, _mm256_castps_si256(sub));
  __m256i v = _mm256_blendv_epi8(normal, subnormal, _mm256_cmpeq_epi32(e, _mm256_setzero_si256()));
  const __m256i nan = _mm256_cmpeq_epi32(_mm256_and_si256(b, _mm256_set1_epi32(0x7F)), _mm256_set1_epi32(0x7F));
  v = _mm256_blendv_epi8(v, _mm256_or_si256(sign, _mm256_set1_epi32(0x7fc00000)), nan);
  return _mm256_castsi256_ps(v);
}

// The 16 values of a 4-bit group rounded into S, split into low and high bytes: two pshufb then
// dequantise 16 weights.
template <DType S>
inline void dq_tables16(__m256 vz, __m256 vs, __m128i* low, __m128i* high) {
  alignas(16) std::uint16_t words[16];
  const __m256 codes = _mm256_setr_ps(0, 1, 2, 3, 4, 5, 6, 7);
  dq_store<S>(reinterpret_cast<std::byte*>(words), 0, _mm256_mul_ps(_mm256_sub_ps(codes, vz), vs));
  dq_store<S>(reinterpret_cast<std::byte*>(words), 8, _mm256_mul_ps(_mm256_sub_ps(_mm256_add_ps(codes, _mm256_set1_ps(8)), vz), vs));
  const __m128i a = _mm_load_si128(reinterpret_cast<const __m128i*>(words));
  const __m128i b = _mm_load_si128(reinterpret_cast<const __m128i*>(words + 8));
  const __m128i even_bytes = _mm_setr_epi8(0, 2, 4, 6, 8, 10, 12, 14, -1, -1, -1, -1, -1, -1, -1, -1);
  const __m128i odd_bytes = _mm_setr_epi8(1, 3, 5, 7, 9, 11, 13, 15, -1, -1, -1, -1, -1, -1, -1, -1);
  *low = _mm_unpacklo_epi64(_mm_shuffle_epi8(a, even_bytes), _mm_shuffle_epi8(b, even_bytes));
  *high = _mm_unpacklo_epi64(_mm_shuffle_epi8(a, odd_bytes), _mm_shuffle_epi8(b, odd_bytes));
}

template <DType S>
inline bool dequantize_rows(const QuantizedMatrix& q, std::int64_t r0, std::int64_t n, std::byte* out) {
  const std::int64_t K = q.cols;
  const simd_detail::RowGroups groups = simd_detail::row_groups(q);
  if (groups.width % 8 != 0 && groups.count > 1) return false;
  const bool packed = q.format == QuantFormat::kPacked;
  if (!packed && q.format != QuantFormat::kInt8 && q.format != QuantFormat::kFp8) return false;
  const int bits = packed ? q.bits : 8;
  const std::int64_t row_bytes = packed ? (K * bits + 31) / 32 * 4 : K;
  const float* fp8 = q.format == QuantFormat::kFp8 ? simd_detail::fp8_table() : nullptr;
  for (std::int64_t r = 0; r < n; ++r) {
    const std::int64_t R = r0 + r;
    const std::byte* row = q.values.data + R * row_bytes;
    std::byte* dst = out + r * K * static_cast<std::int64_t>(dtype_size(S));
    for (std::int64_t gi = 0; gi < groups.count; ++gi) {
      const std::int64_t c0 = gi * groups.width, c1 = c0 + groups.width < K ? c0 + groups.width : K;
      const float s = kernels::detail::scale_at<S>(q.scale.data, simd_detail::scale_index(q, groups, R, gi));
      const float zero = packed ? kernels::detail::packed_zero(q, R, gi, groups.count) : 0.0f;
      const __m256 vs = _mm256_set1_ps(s), vz = _mm256_set1_ps(zero);
      std::int64_t c = c0;
      if constexpr (S != DType::kF32) {
        if (packed && bits == 4 && c1 - c0 >= 64) {
          __m128i low, high;
          dq_tables16<S>(vz, vs, &low, &high);
          for (; c + 16 <= c1; c += 16) {
            const __m128i bytes = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(row + c / 2));
            const __m128i codes = _mm_unpacklo_epi8(_mm_and_si128(bytes, _mm_set1_epi8(0x0F)),
                                                    _mm_and_si128(_mm_srli_epi16(bytes, 4), _mm_set1_epi8(0x0F)));
            const __m128i lo = _mm_shuffle_epi8(low, codes), hi = _mm_shuffle_epi8(high, codes);
            _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + 2 * c), _mm_unpacklo_epi8(lo, hi));
            _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + 2 * c + 16), _mm_unpackhi_epi8(lo, hi));
          }
        }
      }
      for (; c + 8 <= c1; c += 8) {
        __m256 v;
        if (fp8 != nullptr) {
          v = dq_fp8(row + c);
        } else if (!packed) {
          v = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(row + c))));
        } else {
          v = _mm256_sub_ps(_mm256_cvtepi32_ps(dq_fields(row, c, bits)), vz);
        }
        dq_store<S>(dst, c, _mm256_mul_ps(v, vs));
      }
      for (; c < c1; ++c) {
        float v;
        if (fp8 != nullptr) v = fp8[static_cast<std::uint8_t>(row[c])];
        else if (!packed) v = static_cast<float>(static_cast<std::int8_t>(row[c]));
        else v = static_cast<float>(quant::unpack_field(row, c, bits)) - zero;
        kernels::detail::store<S>(dst, c, quant::dequantize(v, s, S));
      }
    }
  }
  return true;
}

DG_END_TARGET

}  // namespace avx2

}  // namespace diffusion_gemma::cpu::kernels

#endif  // DG_X86_KERNELS

namespace diffusion_gemma::cpu::kernels {

// dequantize_rows() on the best vector path `isa` allows, falling back to the scalar form.
inline void dequantize_rows(Isa isa, const QuantizedMatrix& q, std::int64_t r0, std::int64_t n, std::byte* out) {
#if DG_X86_KERNELS
  const auto with_scale = [&](auto simd) {
    switch (q.scale_dtype()) {
      case DType::kBF16: return simd(std::integral_constant<DType, DType::kBF16>{});
      case DType::kF16: return simd(std::integral_constant<DType, DType::kF16>{});
      default: return simd(std::integral_constant<DType, DType::kF32>{});
    }
  };
  if (isa == Isa::kAvx512 || isa == Isa::kAmx) {
    if (with_scale([&](auto s) { return avx512::dequantize_rows<decltype(s)::value>(q, r0, n, out); })) return;
  } else if (isa == Isa::kAvx2) {
    if (with_scale([&](auto s) { return avx2::dequantize_rows<decltype(s)::value>(q, r0, n, out); })) return;
  }
#else
  (void)isa;
#endif
  dequantize_rows(q, r0, n, out);
}

}  // namespace diffusion_gemma::cpu::kernels
