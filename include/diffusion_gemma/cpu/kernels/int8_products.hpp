// SPDX-License-Identifier: Apache-2.0
// Products of 4-bit integer weights (compressed-tensors pack-quantized, and GPTQ without
// activation order; symmetric or asymmetric) with activations rounded to 8-bit integers: the fast
// precision on AVX2 and AVX-512 CPUs without AMX (docs/quantization.md, "The fast precision on
// AVX2"): the AVX2 kernel, or vpdpbusd where the CPU has AVX512-VNNI (the same bits).
//
// Why integers: at a 256-token canvas every expert serves tens of rows at once, so these products
// are bound by arithmetic, and widening 4-bit weights to fp32 (the exact precision) can only add
// to an fp32 product's time. AVX2's vpmaddubsw multiplies 32 unsigned-by-signed byte pairs per
// instruction; measured on a Zen 3 EPYC in an L1-resident 6 x 16 tile it does 72 G multiply-adds/s
// on one core against 45 for fp32 FMA (and 35 for 16-bit vpmaddwd, which is why the activations
// are 8-bit: 16-bit integers are no faster than fp32 there).
//
// The arithmetic, per output y[r][n] with k cut into chunks (the weight's groups, or 128 columns
// when the weight has one scale per row):
//   a[r][c] ~ alpha[r][ch] * (code[r][c] - 128), code = 128 + clamp(rint(a / alpha), -127, 127),
//            alpha = max |a| over the row's chunk / 127            (core/quant.hpp)
//   y[r][n] = sum over chunks of  float(I[r][n][ch]) * (scale[n][ch] * alpha[r][ch])   (fp32 FMA)
//   I[r][n][ch] = sum over the chunk of code[r][c] * w[n][c]  -  128 * sum of w[n][c]  (exact int)
// with w = q - zero in [-16, 15] (GPTQ v1 stores zero points minus one, so a zero can be 16). A
// pair of code * w products is at most 2 * 255 * 16 = 8160 in magnitude, so vpmaddubsw never
// saturates, and a chunk's int32 sum is exact; the result is the same bits on every thread split
// and for a row alone or among others. reference_product() is that arithmetic in scalar code,
// which the AVX2 kernel equals bit for bit (tests/cpu/kernels_test.cpp).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

#include <diffusion_gemma/core/quant.hpp>
#include <diffusion_gemma/cpu/isa.hpp>
#include <diffusion_gemma/cpu/kernels/avx512.hpp>
#include <diffusion_gemma/cpu/kernels/dequantize.hpp>
#include <diffusion_gemma/cpu/kernels/operands.hpp>
#include <diffusion_gemma/model/quantized_matrix.hpp>

namespace diffusion_gemma::cpu::kernels::int8 {

// Columns of k per activation scale when the weight has one scale per output row (or one in all):
// short enough that an outlier only coarsens its own 128 columns.
inline constexpr std::int64_t kChannelChunk = 128;
// Output columns per weight panel (two AVX2 registers of 8 int32 sums).
inline constexpr std::int64_t kPanel = 16;

// Whether a quantized matrix has this kernel: 4-bit pack-quantized or GPTQ with its groups in
// input order, k a multiple of 4 (the kernel reads 4 inputs per byte lane group), groups a
// multiple of 32 (one register of codes per step).
inline bool supported(const QuantizedMatrix& q) {
  const bool layout = q.format == QuantFormat::kPacked || (q.format == QuantFormat::kGptq && q.groups_in_order);
  return layout && q.bits == 4 && q.cols > 0 && q.cols % 4 == 0 && (q.group_size <= 0 || q.group_size % 32 == 0);
}

// How k is cut: chunk ch covers columns [ch * length, min(k, (ch + 1) * length)).
struct Chunks {
  std::int64_t length = 0, count = 0;
};
inline Chunks chunks_of(const QuantizedMatrix& q) {
  Chunks c;
  c.length = q.group_size > 0 ? q.group_size : kChannelChunk;
  c.count = (q.cols + c.length - 1) / c.length;
  return c;
}

// Activations rounded for one product: `codes` [m][k] bytes, `scales` [m][chunks].
struct Activations {
  const std::uint8_t* codes = nullptr;
  const float* scales = nullptr;
  std::int64_t m = 0, k = 0;
  Chunks chunks;
};

// One panel of 16 weight rows (output columns), unpacked for the kernel:
//   values  [k / 4][16][4] signed bytes w = q - zero (the 4 consecutive inputs of a column side by
//           side, as vpmaddubsw pairs them), zero past the matrix's last row;
//   offset  [chunks][16] int32: -128 * the chunk's sum of w (removes the codes' +128);
//   scale   [chunks][16] float: the weight scale of the chunk's group, 0 past the last row.
struct Panel {
  std::int8_t* values = nullptr;
  std::int32_t* offset = nullptr;
  float* scale = nullptr;
};
inline std::size_t panel_value_bytes(std::int64_t k) { return static_cast<std::size_t>(k * kPanel); }

namespace detail {

// The weight scale of row r for the chunk starting at input c0 (GPTQ: scales [groups, rows]).
template <DType S>
inline float scale_typed(const QuantizedMatrix& q, std::int64_t r, std::int64_t c0) {
  if (q.format == QuantFormat::kGptq) return kernels::detail::scale_at<S>(q.scale.data, (c0 / q.group_size) * q.rows + r);
  return kernels::detail::ct_scale<S>(q, r, c0);
}
inline float scale_of(const QuantizedMatrix& q, std::int64_t r, std::int64_t c0) {
  switch (q.scale_dtype()) {
    case DType::kBF16: return scale_typed<DType::kBF16>(q, r, c0);
    case DType::kF16: return scale_typed<DType::kF16>(q, r, c0);
    default: return scale_typed<DType::kF32>(q, r, c0);
  }
}

// The integer subtracted from row r's stored 4-bit values in chunk ch.
inline int zero_of(const QuantizedMatrix& q, std::int64_t r, std::int64_t ch) {
  if (q.format == QuantFormat::kGptq) {
    const std::int64_t zero_words = (q.rows * q.bits + 31) / 32;
    return static_cast<int>(quant::unpack_field(q.zero_point.data + ch * zero_words * 4, r, q.bits)) + q.zero_offset;
  }
  return static_cast<int>(kernels::detail::packed_zero(q, r, q.group_size > 0 ? ch : 0, q.groups()));
}

// The stored 4-bit value of (row r, input c). GPTQ: qweight [inputs / 8, rows], 8 inputs a word.
inline int value_at(const QuantizedMatrix& q, std::int64_t r, std::int64_t c) {
  if (q.format == QuantFormat::kGptq) {
    return static_cast<int>((quant::load_word(q.values.data, (c / 8) * q.rows + r) >> (4 * (c % 8))) & 0xFu);
  }
  return static_cast<int>(quant::unpack_field(q.values.data + r * ((q.cols * 4 + 31) / 32) * 4, c, 4));
}

// Inputs [c, c1) of row r, as panel column j, into the panel's values: q - zero, or 0 past the
// matrix's last row. Returns their sum. The scalar form, and the tails of the vector forms.
inline std::int32_t unpack_inputs(const QuantizedMatrix& q, std::int64_t r, std::int64_t j, int zero, std::int64_t c,
                                  std::int64_t c1, std::int8_t* values) {
  std::int32_t sum = 0;
  for (; c < c1; ++c) {
    const int w = r < q.rows ? value_at(q, r, c) - zero : 0;
    values[(c / 4) * kPanel * 4 + j * 4 + c % 4] = static_cast<std::int8_t>(w);
    sum += w;
  }
  return sum;
}

// max(absmax, |row[c]| for c in [c, c1)), or NaN when one of them (or `nan` already) is NaN.
inline float fold_absmax(const float* row, std::int64_t c, std::int64_t c1, float absmax, bool nan) {
  for (; c < c1; ++c) {
    nan |= std::isnan(row[c]);
    absmax = std::max(absmax, std::fabs(row[c]));
  }
  return nan ? std::nanf("") : absmax;
}

// The packed 32-bit words of row r.
inline const std::byte* packed_row(const QuantizedMatrix& q, std::int64_t r) {
  return q.values.data + r * ((q.cols * q.bits + 31) / 32) * 4;
}

// The weight scale and the zero of every (chunk, row) of the panel at rows [n0, n0 + 16):
// `scale` and `zero` [chunks][16], 0 past the matrix's last row. The index arithmetic is done once
// per panel: asked per entry (scale_of, zero_of) it cost two 64-bit divisions each, which took
// most of a panel's unpacking at group size 64.
inline void panel_scales_zeros(const QuantizedMatrix& q, std::int64_t n0, const Chunks& chunks, float* scale,
                               std::int32_t* zero) {
  const std::int64_t nvalid = std::min<std::int64_t>(kPanel, q.rows - n0);
  const bool gptq = q.format == QuantFormat::kGptq;
  const std::int64_t groups = q.groups(), zero_words = (q.rows * q.bits + 31) / 32;
  const DType sd = q.scale_dtype();
  const auto scale_at = [&](std::int64_t i) {
    switch (sd) {
      case DType::kBF16: return kernels::detail::scale_at<DType::kBF16>(q.scale.data, i);
      case DType::kF16: return kernels::detail::scale_at<DType::kF16>(q.scale.data, i);
      default: return kernels::detail::scale_at<DType::kF32>(q.scale.data, i);
    }
  };
  for (std::int64_t ch = 0; ch < chunks.count; ++ch) {
    // Chunks are the groups when there are groups (chunks_of), so a chunk's group is its index.
    const std::int64_t g = q.group_size > 0 ? ch : 0;
    for (std::int64_t j = 0; j < kPanel; ++j) {
      const std::int64_t r = n0 + j, at = ch * kPanel + j;
      if (j >= nvalid) {
        scale[at] = 0.0f;
        zero[at] = 0;
      } else if (gptq) {
        scale[at] = scale_at(g * q.rows + r);
        zero[at] = static_cast<std::int32_t>(quant::unpack_field(q.zero_point.data + g * zero_words * 4, r, q.bits)) +
                   q.zero_offset;
      } else {
        scale[at] = scale_at(q.group_size < 0 ? 0 : q.group_size == 0 ? r : r * groups + g);
        zero[at] = static_cast<std::int32_t>(kernels::detail::packed_zero(q, r, g, groups));
      }
    }
  }
}

}  // namespace detail

// Rows [0, m) of x rounded to codes and scales, in scalar code (the reference for the AVX2 form).
inline void quantize_activations_scalar(const float* x, std::int64_t ldx, std::int64_t m, std::int64_t k,
                                        const Chunks& chunks, std::uint8_t* codes, float* scales) {
  for (std::int64_t r = 0; r < m; ++r) {
    const float* row = x + r * ldx;
    for (std::int64_t ch = 0; ch < chunks.count; ++ch) {
      const std::int64_t c0 = ch * chunks.length, c1 = std::min(k, c0 + chunks.length);
      const float absmax = detail::fold_absmax(row, c0, c1, 0.0f, false);
      const float inv = quant::activation_inverse_scale(absmax);
      scales[r * chunks.count + ch] = quant::activation_scale(absmax);
      for (std::int64_t c = c0; c < c1; ++c) codes[r * k + c] = quant::activation_code(row[c], inv);
    }
  }
}

// Rows [n0, n0 + 16) of q as a Panel (rows past q.rows are zero), in scalar code.
inline void unpack_panel_scalar(const QuantizedMatrix& q, std::int64_t n0, const Chunks& chunks, Panel p) {
  const std::int64_t k = q.cols;
  for (std::int64_t j = 0; j < kPanel; ++j) {
    const std::int64_t r = n0 + j;
    const bool valid = r < q.rows;
    for (std::int64_t ch = 0; ch < chunks.count; ++ch) {
      const std::int64_t c0 = ch * chunks.length, c1 = std::min(k, c0 + chunks.length);
      const int zero = valid ? detail::zero_of(q, r, ch) : 0;
      p.offset[ch * kPanel + j] = -128 * detail::unpack_inputs(q, r, j, zero, c0, c1, p.values);
      p.scale[ch * kPanel + j] = valid ? detail::scale_of(q, r, c0) : 0.0f;
    }
  }
}

// y[r][n0 + j] (+)= the product of rows [0, m) with panel `p`, for j < nvalid, in scalar code:
// the arithmetic the AVX2 kernel performs, in the same order.
inline void panel_product_scalar(const Activations& a, const Panel& p, std::int64_t nvalid, float* y, std::int64_t ldy,
                                 bool accumulate) {
  for (std::int64_t r = 0; r < a.m; ++r) {
    for (std::int64_t j = 0; j < nvalid; ++j) {
      float f = 0.0f;
      for (std::int64_t ch = 0; ch < a.chunks.count; ++ch) {
        const std::int64_t c0 = ch * a.chunks.length, c1 = std::min(a.k, c0 + a.chunks.length);
        std::int32_t sum = p.offset[ch * kPanel + j];
        for (std::int64_t c = c0; c < c1; ++c) {
          sum += static_cast<std::int32_t>(a.codes[r * a.k + c]) * p.values[(c / 4) * kPanel * 4 + j * 4 + c % 4];
        }
        const float s = p.scale[ch * kPanel + j] * a.scales[r * a.chunks.count + ch];
        f = std::fma(static_cast<float>(sum), s, f);
      }
      float& out = y[r * ldy + j];
      out = accumulate ? out + f : f;
    }
  }
}

#if DG_X86_KERNELS

namespace avx2 {

DG_BEGIN_TARGET_AVX2

// Row r's chunk [c0, c1) of x rounded to codes; returns the chunk's scale.
inline float quantize_chunk(const float* row, std::int64_t c0, std::int64_t c1, std::uint8_t* codes) {
  __m256 vmax = _mm256_setzero_ps();
  __m256 vnan = _mm256_setzero_ps();
  const __m256 sign = _mm256_set1_ps(-0.0f);
  std::int64_t c = c0;
  for (; c + 8 <= c1; c += 8) {
    const __m256 v = _mm256_loadu_ps(row + c);
    vnan = _mm256_or_ps(vnan, _mm256_cmp_ps(v, v, _CMP_UNORD_Q));
    vmax = _mm256_max_ps(vmax, _mm256_andnot_ps(sign, v));
  }
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, vmax);
  float absmax = 0.0f;
  for (float l : lanes) absmax = std::max(absmax, l);
  absmax = detail::fold_absmax(row, c, c1, absmax, _mm256_movemask_ps(vnan) != 0);
  const float inv = quant::activation_inverse_scale(absmax);
  const __m256 vinv = _mm256_set1_ps(inv);
  const __m256i lo = _mm256_set1_epi32(-127), hi = _mm256_set1_epi32(127), bias = _mm256_set1_epi32(128);
  const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
  c = c0;
  for (; c + 32 <= c1; c += 32) {
    __m256i v[4];
    for (int i = 0; i < 4; ++i) {
      const __m256i t = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(row + c + 8 * i), vinv));
      v[i] = _mm256_add_epi32(_mm256_min_epi32(_mm256_max_epi32(t, lo), hi), bias);
    }
    const __m256i bytes = _mm256_packus_epi16(_mm256_packs_epi32(v[0], v[1]), _mm256_packs_epi32(v[2], v[3]));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(codes + c), _mm256_permutevar8x32_epi32(bytes, order));
  }
  for (; c < c1; ++c) codes[c] = quant::activation_code(row[c], inv);
  return quant::activation_scale(absmax);
}

inline void quantize_activations(const float* x, std::int64_t ldx, std::int64_t m, std::int64_t k, const Chunks& chunks,
                                 std::uint8_t* codes, float* scales) {
  for (std::int64_t r = 0; r < m; ++r) {
    for (std::int64_t ch = 0; ch < chunks.count; ++ch) {
      const std::int64_t c0 = ch * chunks.length, c1 = std::min(k, c0 + chunks.length);
      scales[r * chunks.count + ch] = quantize_chunk(x + r * ldx, c0, c1, codes + r * k);
    }
  }
}

// Rows [n0, n0 + 16) of a pack-quantized q as a Panel: the scalar form's values, 32 inputs of a
// row per step.
inline void unpack_panel_packed(const QuantizedMatrix& q, std::int64_t n0, const Chunks& chunks, Panel p) {
  const std::int64_t k = q.cols;
  const __m128i nibble = _mm_set1_epi8(0x0F);
  const __m256i ones8 = _mm256_set1_epi8(1);
  const __m256i ones16 = _mm256_set1_epi16(1);
  auto* out = reinterpret_cast<std::uint32_t*>(p.values);
  std::int32_t* zeros = kernels::scratch<std::int32_t, 14>(static_cast<std::size_t>(chunks.count * kPanel));
  detail::panel_scales_zeros(q, n0, chunks, p.scale, zeros);
  for (std::int64_t j = 0; j < kPanel; ++j) {
    const std::int64_t r = n0 + j;
    const bool valid = r < q.rows;
    const std::byte* row = valid ? detail::packed_row(q, r) : nullptr;
    for (std::int64_t ch = 0; ch < chunks.count; ++ch) {
      const std::int64_t c0 = ch * chunks.length, c1 = std::min(k, c0 + chunks.length);
      const int zero = zeros[ch * kPanel + j];
      const __m256i vzero = _mm256_set1_epi8(static_cast<char>(zero));
      __m256i vsum = _mm256_setzero_si256();
      std::int64_t c = c0;
      if (valid) {
        for (; c + 32 <= c1; c += 32) {
          const __m128i bytes = _mm_loadu_si128(reinterpret_cast<const __m128i*>(row + c / 2));
          const __m128i l = _mm_and_si128(bytes, nibble), h = _mm_and_si128(_mm_srli_epi16(bytes, 4), nibble);
          const __m256i codes = _mm256_set_m128i(_mm_unpackhi_epi8(l, h), _mm_unpacklo_epi8(l, h));
          const __m256i w = _mm256_sub_epi8(codes, vzero);
          vsum = _mm256_add_epi32(vsum, _mm256_madd_epi16(_mm256_maddubs_epi16(ones8, w), ones16));
          alignas(32) std::uint32_t quads[8];
          _mm256_store_si256(reinterpret_cast<__m256i*>(quads), w);
          std::uint32_t* dst = out + (c / 4) * kPanel + j;
          for (int d = 0; d < 8; ++d) dst[d * kPanel] = quads[d];
        }
      }
      alignas(32) std::int32_t lanes[8];
      _mm256_store_si256(reinterpret_cast<__m256i*>(lanes), vsum);
      std::int32_t sum = 0;
      for (std::int32_t l : lanes) sum += l;
      sum += detail::unpack_inputs(q, r, j, zero, c, c1, p.values);
      p.offset[ch * kPanel + j] = -128 * sum;
    }
  }
}

// 8 GPTQ words (8 output rows, inputs c..c+7 each) as the panel's two quads of those rows: `first`
// gets inputs c..c+3 of the 8 rows, `second` c+4..c+7, a row's 4 inputs in consecutive bytes.
inline void gptq_quads(__m256i words, __m256i* first, __m256i* second) {
  const __m256i nibble = _mm256_set1_epi8(0x0F);
  const __m256i lo = _mm256_and_si256(words, nibble), hi = _mm256_and_si256(_mm256_srli_epi16(words, 4), nibble);
  // Per 128-bit lane (4 rows): each row's 8 inputs in order, rows 0-1 then rows 2-3.
  const __m256i rows01 = _mm256_shuffle_epi32(_mm256_unpacklo_epi8(lo, hi), _MM_SHUFFLE(3, 1, 2, 0));
  const __m256i rows23 = _mm256_shuffle_epi32(_mm256_unpackhi_epi8(lo, hi), _MM_SHUFFLE(3, 1, 2, 0));
  *first = _mm256_unpacklo_epi64(rows01, rows23);
  *second = _mm256_unpackhi_epi64(rows01, rows23);
}

// Rows [n0, n0 + 16) of a GPTQ q as a Panel. Its words hold 8 inputs of one row and lie row after
// row, so 16 rows' 8 inputs are two loads; partial panels and tails take the scalar form.
inline void unpack_panel_gptq(const QuantizedMatrix& q, std::int64_t n0, const Chunks& chunks, Panel p) {
  const std::int64_t k = q.cols, n = q.rows;
  const std::int64_t nvalid = std::min(kPanel, n - n0);
  const __m256i ones8 = _mm256_set1_epi8(1);
  const __m256i ones16 = _mm256_set1_epi16(1);
  std::int32_t* panel_zeros = kernels::scratch<std::int32_t, 14>(static_cast<std::size_t>(chunks.count * kPanel));
  detail::panel_scales_zeros(q, n0, chunks, p.scale, panel_zeros);
  for (std::int64_t ch = 0; ch < chunks.count; ++ch) {
    const std::int64_t c0 = ch * chunks.length, c1 = std::min(k, c0 + chunks.length);
    alignas(32) std::int8_t zeros[kPanel * 4];
    const std::int32_t* zero = panel_zeros + ch * kPanel;
    for (std::int64_t j = 0; j < kPanel; ++j) {
      for (int b = 0; b < 4; ++b) zeros[j * 4 + b] = static_cast<std::int8_t>(zero[j]);
    }
    const __m256i z0 = _mm256_load_si256(reinterpret_cast<const __m256i*>(zeros));
    const __m256i z1 = _mm256_load_si256(reinterpret_cast<const __m256i*>(zeros + 32));
    __m256i sum0 = _mm256_setzero_si256(), sum1 = _mm256_setzero_si256();
    std::int64_t c = c0;
    if (nvalid == kPanel) {
      for (; c + 8 <= c1; c += 8) {
        const std::byte* src = q.values.data + ((c / 8) * n + n0) * 4;
        __m256i a0, a1, b0, b1;
        gptq_quads(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(src)), &a0, &a1);
        gptq_quads(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + 32)), &b0, &b1);
        a0 = _mm256_sub_epi8(a0, z0);
        a1 = _mm256_sub_epi8(a1, z0);
        b0 = _mm256_sub_epi8(b0, z1);
        b1 = _mm256_sub_epi8(b1, z1);
        std::int8_t* dst = p.values + (c / 4) * kPanel * 4;
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst), a0);
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + 32), b0);
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + 64), a1);
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + 96), b1);
        sum0 = _mm256_add_epi32(sum0, _mm256_madd_epi16(_mm256_maddubs_epi16(ones8, _mm256_add_epi8(a0, a1)), ones16));
        sum1 = _mm256_add_epi32(sum1, _mm256_madd_epi16(_mm256_maddubs_epi16(ones8, _mm256_add_epi8(b0, b1)), ones16));
      }
    }
    alignas(32) std::int32_t sums[kPanel];
    _mm256_store_si256(reinterpret_cast<__m256i*>(sums), sum0);
    _mm256_store_si256(reinterpret_cast<__m256i*>(sums + 8), sum1);
    for (std::int64_t j = 0; j < kPanel; ++j) {
      p.offset[ch * kPanel + j] = -128 * (sums[j] + detail::unpack_inputs(q, n0 + j, j, zero[j], c, c1, p.values));
    }
  }
}

inline void unpack_panel(const QuantizedMatrix& q, std::int64_t n0, const Chunks& chunks, Panel p) {
  if (q.format == QuantFormat::kGptq) return unpack_panel_gptq(q, n0, chunks, p);
  unpack_panel_packed(q, n0, chunks, p);
}

// Quads (4 inputs) whose byte products one tile row sums in 16 bits before widening to 32.
constexpr int kQuadRun = 4;
static_assert(kQuadRun * 2 * 255 * 16 < 32768, "the 16-bit sums of kQuadRun quads must not wrap");

// MR rows (at most 6) of activations times one panel: for each chunk, int32 sums of 4-input byte
// products in registers (12 of the 16), then one FMA each into the fp32 sums.
template <int MR>
inline void panel_tile(const Activations& a, std::int64_t r0, const Panel& p, std::int64_t nvalid, float* y,
                       std::int64_t ldy, bool accumulate) {
  alignas(32) float f[MR][kPanel];
  for (int i = 0; i < MR; ++i)
    for (std::int64_t j = 0; j < kPanel; ++j) f[i][j] = 0.0f;
  const __m256i ones16 = _mm256_set1_epi16(1);
  const std::uint8_t* codes = a.codes + r0 * a.k;
  const float* ascale = a.scales + r0 * a.chunks.count;
  for (std::int64_t ch = 0; ch < a.chunks.count; ++ch) {
    const std::int64_t q0 = ch * a.chunks.length / 4, q1 = std::min(a.k, (ch + 1) * a.chunks.length) / 4;
    const __m256i off0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p.offset + ch * kPanel));
    const __m256i off1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p.offset + ch * kPanel + 8));
    __m256i s0[MR], s1[MR];
#pragma GCC unroll 6
    for (int i = 0; i < MR; ++i) {
      s0[i] = off0;
      s1[i] = off1;
    }
    const std::int8_t* wq = p.values + q0 * kPanel * 4;
    // No lambdas returning vectors here: a lambda does not inherit this function's target, so a
    // consumer built without -mavx2 would get an ABI error for its __m256i return.
    std::int32_t quad;
    std::int64_t qd = q0;
    // kQuadRun quads summed in 16 bits, then widened once: vpmaddubsw and vpmaddwd share one
    // pipe on a Zen 2 (1 per cycle together, measured), so widening every quad made 32 byte
    // products cost 2 cycles, the fp32 FMA rate. kQuadRun pair sums are at most 4 * 8160 < 2^15
    // in magnitude, so the 16-bit adds never wrap and the int32 sums are the same integers.
    for (; qd + kQuadRun <= q1; qd += kQuadRun, wq += kQuadRun * kPanel * 4) {
#pragma GCC unroll 6
      for (int i = 0; i < MR; ++i) {
        std::memcpy(&quad, codes + i * a.k + 4 * qd, 4);
        __m256i x = _mm256_set1_epi32(quad);
        __m256i t0 = _mm256_maddubs_epi16(x, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wq)));
        __m256i t1 = _mm256_maddubs_epi16(x, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wq + 32)));
#pragma GCC unroll 4
        for (int j = 1; j < kQuadRun; ++j) {
          const std::int8_t* wj = wq + j * kPanel * 4;
          std::memcpy(&quad, codes + i * a.k + 4 * (qd + j), 4);
          x = _mm256_set1_epi32(quad);
          t0 = _mm256_add_epi16(t0, _mm256_maddubs_epi16(x, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wj))));
          t1 = _mm256_add_epi16(t1, _mm256_maddubs_epi16(x, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wj + 32))));
        }
        s0[i] = _mm256_add_epi32(s0[i], _mm256_madd_epi16(t0, ones16));
        s1[i] = _mm256_add_epi32(s1[i], _mm256_madd_epi16(t1, ones16));
      }
    }
    for (; qd < q1; ++qd, wq += kPanel * 4) {  // a chunk's last 1-3 quads (k not a multiple of 16)
      const __m256i w0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wq));
      const __m256i w1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wq + 32));
#pragma GCC unroll 6
      for (int i = 0; i < MR; ++i) {
        std::memcpy(&quad, codes + i * a.k + 4 * qd, 4);
        const __m256i x = _mm256_set1_epi32(quad);
        s0[i] = _mm256_add_epi32(s0[i], _mm256_madd_epi16(_mm256_maddubs_epi16(x, w0), ones16));
        s1[i] = _mm256_add_epi32(s1[i], _mm256_madd_epi16(_mm256_maddubs_epi16(x, w1), ones16));
      }
    }
    const __m256 ws0 = _mm256_loadu_ps(p.scale + ch * kPanel), ws1 = _mm256_loadu_ps(p.scale + ch * kPanel + 8);
#pragma GCC unroll 6
    for (int i = 0; i < MR; ++i) {
      const __m256 as = _mm256_set1_ps(ascale[i * a.chunks.count + ch]);
      _mm256_store_ps(f[i], _mm256_fmadd_ps(_mm256_cvtepi32_ps(s0[i]), _mm256_mul_ps(ws0, as), _mm256_load_ps(f[i])));
      _mm256_store_ps(f[i] + 8,
                      _mm256_fmadd_ps(_mm256_cvtepi32_ps(s1[i]), _mm256_mul_ps(ws1, as), _mm256_load_ps(f[i] + 8)));
    }
  }
  for (int i = 0; i < MR; ++i) {
    float* out = y + (r0 + i) * ldy;
    for (std::int64_t j = 0; j < nvalid; ++j) out[j] = accumulate ? out[j] + f[i][j] : f[i][j];
  }
}

inline void panel_product(const Activations& a, const Panel& p, std::int64_t nvalid, float* y, std::int64_t ldy,
                          bool accumulate) {
  std::int64_t r = 0;
  for (; r + 6 <= a.m; r += 6) panel_tile<6>(a, r, p, nvalid, y, ldy, accumulate);
  switch (a.m - r) {
    case 1: return panel_tile<1>(a, r, p, nvalid, y, ldy, accumulate);
    case 2: return panel_tile<2>(a, r, p, nvalid, y, ldy, accumulate);
    case 3: return panel_tile<3>(a, r, p, nvalid, y, ldy, accumulate);
    case 4: return panel_tile<4>(a, r, p, nvalid, y, ldy, accumulate);
    case 5: return panel_tile<5>(a, r, p, nvalid, y, ldy, accumulate);
    default: return;
  }
}

DG_END_TARGET

}  // namespace avx2

// The same products on AVX-512 CPUs with VNNI (Zen 4, Ice Lake and later): a panel's quad of 16
// columns is one 64-byte vector, exactly vpdpbusd's signed operand, so one instruction adds the 64
// byte products that take AVX2 six (two vpmaddubsw, two vpmaddwd, two adds). The int32 sums are the
// same exact integers and the fp32 step the same FMA, so the bits are the AVX2 kernel's.
namespace avx512vnni {

DG_BEGIN_TARGET_AVX512VNNI

constexpr int kMr = 12;  // rows per tile: 12 int32 and 12 fp32 accumulators

template <int MR>
inline void panel_tile(const Activations& a, std::int64_t r0, const Panel& p, std::int64_t nvalid, float* y,
                       std::int64_t ldy, bool accumulate) {
  __m512 f[MR];
#pragma GCC unroll 12
  for (int i = 0; i < MR; ++i) f[i] = _mm512_setzero_ps();
  const std::uint8_t* codes = a.codes + r0 * a.k;
  const float* ascale = a.scales + r0 * a.chunks.count;
  for (std::int64_t ch = 0; ch < a.chunks.count; ++ch) {
    const std::int64_t q0 = ch * a.chunks.length / 4, q1 = std::min(a.k, (ch + 1) * a.chunks.length) / 4;
    const __m512i off = _mm512_loadu_si512(p.offset + ch * kPanel);
    __m512i s[MR];
#pragma GCC unroll 12
    for (int i = 0; i < MR; ++i) s[i] = off;
    const std::int8_t* wq = p.values + q0 * kPanel * 4;
    for (std::int64_t qd = q0; qd < q1; ++qd, wq += kPanel * 4) {
      const __m512i w = _mm512_loadu_si512(wq);
#pragma GCC unroll 12
      for (int i = 0; i < MR; ++i) {
        std::int32_t quad;
        std::memcpy(&quad, codes + i * a.k + 4 * qd, 4);
        s[i] = _mm512_dpbusd_epi32(s[i], _mm512_set1_epi32(quad), w);
      }
    }
    const __m512 ws = _mm512_loadu_ps(p.scale + ch * kPanel);
#pragma GCC unroll 12
    for (int i = 0; i < MR; ++i) {
      const __m512 as = _mm512_set1_ps(ascale[i * a.chunks.count + ch]);
      f[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s[i]), _mm512_mul_ps(ws, as), f[i]);
    }
  }
  const __mmask16 m = avx512::lanes(nvalid);
#pragma GCC unroll 12
  for (int i = 0; i < MR; ++i) {
    float* out = y + (r0 + i) * ldy;
    _mm512_mask_storeu_ps(out, m, accumulate ? _mm512_add_ps(_mm512_maskz_loadu_ps(m, out), f[i]) : f[i]);
  }
}

// Rows [n0, n0 + 16) of a pack-quantized q as a Panel, all 16 rows at once: the AVX2 form's bytes.
// A 16-bit word of a packed row holds one quad (4 inputs, least significant nibble first), so 32
// inputs of 16 rows are a 16 x 8 transpose of words (two rounds of vpermt2w), and each word then
// spreads to the quad's 4 bytes. Needs a whole panel and chunks of whole 32-input steps.
inline void unpack_panel_packed_whole(const QuantizedMatrix& q, std::int64_t n0, const Chunks& chunks, Panel p) {
  const std::byte* row[kPanel];
  for (std::int64_t j = 0; j < kPanel; ++j) row[j] = detail::packed_row(q, n0 + j);
  // Stage 1: from 4 rows per vector to (quad d, row) for 8 rows, d in 0-3 (`lo`) or 4-7 (`hi`).
  alignas(64) std::int16_t stage1_lo[32], stage1_hi[32], stage2_lo[32], stage2_hi[32];
  for (int pos = 0; pos < 32; ++pos) {
    const int d = pos / 8, r = pos % 8;
    const int src = r < 4 ? 8 * r + d : 32 + 8 * (r - 4) + d;
    stage1_lo[pos] = static_cast<std::int16_t>(src);
    stage1_hi[pos] = static_cast<std::int16_t>(src + 4);
    // Stage 2: (d, rows 0-7) and (d, rows 8-15) to (d, rows 0-15), for two quads per vector.
    const int dd = pos / 16, r16 = pos % 16;
    const int src2 = r16 < 8 ? dd * 8 + r16 : 32 + dd * 8 + r16 - 8;
    stage2_lo[pos] = static_cast<std::int16_t>(src2);
    stage2_hi[pos] = static_cast<std::int16_t>(src2 + 16);
  }
  const __m512i s1lo = _mm512_load_si512(stage1_lo), s1hi = _mm512_load_si512(stage1_hi);
  const __m512i s2lo = _mm512_load_si512(stage2_lo), s2hi = _mm512_load_si512(stage2_hi);
  const __m512i nibbles = _mm512_set1_epi32(0x0F0F);
  // Bytes (n0, n2, n1, n3) of each 32-bit lane back to input order.
  const __m512i order = _mm512_set4_epi32(0x0F0D0E0C, 0x0B090A08, 0x07050604, 0x03010200);
  const __m512i ones = _mm512_set1_epi8(1);
  const auto quad_bytes = [&](__m256i words) {
    const __m512i x = _mm512_cvtepu16_epi32(words);
    const __m512i lo = _mm512_and_si512(x, nibbles), hi = _mm512_and_si512(_mm512_srli_epi32(x, 4), nibbles);
    return _mm512_shuffle_epi8(_mm512_or_si512(lo, _mm512_slli_epi32(hi, 16)), order);
  };
  const auto four_rows = [&](int j0, std::int64_t c) {
    __m512i v = _mm512_castsi128_si512(_mm_loadu_si128(reinterpret_cast<const __m128i*>(row[j0] + c / 2)));
    v = _mm512_inserti32x4(v, _mm_loadu_si128(reinterpret_cast<const __m128i*>(row[j0 + 1] + c / 2)), 1);
    v = _mm512_inserti32x4(v, _mm_loadu_si128(reinterpret_cast<const __m128i*>(row[j0 + 2] + c / 2)), 2);
    return _mm512_inserti32x4(v, _mm_loadu_si128(reinterpret_cast<const __m128i*>(row[j0 + 3] + c / 2)), 3);
  };
  std::int32_t* zeros = kernels::scratch<std::int32_t, 14>(static_cast<std::size_t>(chunks.count * kPanel));
  detail::panel_scales_zeros(q, n0, chunks, p.scale, zeros);
  for (std::int64_t ch = 0; ch < chunks.count; ++ch) {
    const std::int64_t c0 = ch * chunks.length, c1 = std::min(q.cols, c0 + chunks.length);
    // Each row's zero in all 4 bytes of its lane.
    const __m512i vzero = _mm512_mullo_epi32(_mm512_loadu_si512(zeros + ch * kPanel), _mm512_set1_epi32(0x01010101));
    __m512i sum = _mm512_setzero_si512();
    for (std::int64_t c = c0; c < c1; c += 32) {
      const __m512i a = four_rows(0, c), b = four_rows(4, c), e = four_rows(8, c), g = four_rows(12, c);
      const __m512i p_lo = _mm512_permutex2var_epi16(a, s1lo, b), p_hi = _mm512_permutex2var_epi16(a, s1hi, b);
      const __m512i q_lo = _mm512_permutex2var_epi16(e, s1lo, g), q_hi = _mm512_permutex2var_epi16(e, s1hi, g);
      const __m512i pairs[4] = {_mm512_permutex2var_epi16(p_lo, s2lo, q_lo), _mm512_permutex2var_epi16(p_lo, s2hi, q_lo),
                                _mm512_permutex2var_epi16(p_hi, s2lo, q_hi), _mm512_permutex2var_epi16(p_hi, s2hi, q_hi)};
      std::int8_t* dst = p.values + (c / 4) * kPanel * 4;
      for (int i = 0; i < 4; ++i) {
        const __m512i w0 = _mm512_sub_epi8(quad_bytes(_mm512_castsi512_si256(pairs[i])), vzero);
        const __m512i w1 = _mm512_sub_epi8(quad_bytes(_mm512_extracti64x4_epi64(pairs[i], 1)), vzero);
        _mm512_storeu_si512(dst + (2 * i) * 64, w0);
        _mm512_storeu_si512(dst + (2 * i + 1) * 64, w1);
        sum = _mm512_dpbusd_epi32(sum, ones, w0);
        sum = _mm512_dpbusd_epi32(sum, ones, w1);
      }
    }
    _mm512_storeu_si512(p.offset + ch * kPanel, _mm512_sub_epi32(_mm512_setzero_si512(), _mm512_slli_epi32(sum, 7)));
  }
}

// A panel for the VNNI and AMX-INT8 forms: whole pack-quantized panels on 32-input chunks take the
// AVX-512 transpose above, the rest the AVX2 code.
inline void unpack_panel(const QuantizedMatrix& q, std::int64_t n0, const Chunks& chunks, Panel p) {
  if (q.format == QuantFormat::kPacked && n0 + kPanel <= q.rows && q.cols % 32 == 0 && chunks.length % 32 == 0) {
    return unpack_panel_packed_whole(q, n0, chunks, p);
  }
  avx2::unpack_panel(q, n0, chunks, p);
}

inline void panel_product(const Activations& a, const Panel& p, std::int64_t nvalid, float* y, std::int64_t ldy,
                          bool accumulate) {
  std::int64_t r = 0;
  for (; r + kMr <= a.m; r += kMr) panel_tile<kMr>(a, r, p, nvalid, y, ldy, accumulate);
  switch (a.m - r) {
    case 1: return panel_tile<1>(a, r, p, nvalid, y, ldy, accumulate);
    case 2: return panel_tile<2>(a, r, p, nvalid, y, ldy, accumulate);
    case 3: return panel_tile<3>(a, r, p, nvalid, y, ldy, accumulate);
    case 4: return panel_tile<4>(a, r, p, nvalid, y, ldy, accumulate);
    case 5: return panel_tile<5>(a, r, p, nvalid, y, ldy, accumulate);
    case 6: return panel_tile<6>(a, r, p, nvalid, y, ldy, accumulate);
    case 7: return panel_tile<7>(a, r, p, nvalid, y, ldy, accumulate);
    case 8: return panel_tile<8>(a, r, p, nvalid, y, ldy, accumulate);
    case 9: return panel_tile<9>(a, r, p, nvalid, y, ldy, accumulate);
    case 10: return panel_tile<10>(a, r, p, nvalid, y, ldy, accumulate);
    case 11: return panel_tile<11>(a, r, p, nvalid, y, ldy, accumulate);
    default: return;
  }
}

DG_END_TARGET

}  // namespace avx512vnni

#endif  // DG_X86_KERNELS

// Per-thread buffers of one panel for a k-column matrix cut into `chunks`.
inline Panel panel_scratch(std::int64_t k, const Chunks& chunks) {
  Panel p;
  p.values = kernels::scratch<std::int8_t, 10>(panel_value_bytes(k));
  p.offset = kernels::scratch<std::int32_t, 11>(static_cast<std::size_t>(chunks.count * kPanel));
  p.scale = kernels::scratch<float, 12>(static_cast<std::size_t>(chunks.count * kPanel));
  return p;
}

// Which form of the products runs (the caller has checked the CPU for the vector ones).
enum class Form { kScalar, kAvx2, kAvx512Vnni };

// y[:, n0:n1) (+)= a times rows [n0, n1) of q, panel by panel (n0 a multiple of 16).
inline void product_columns(const QuantizedMatrix& q, const Activations& a, std::int64_t n0, std::int64_t n1, float* y,
                            std::int64_t ldy, bool accumulate, Form form) {
  const Panel p = panel_scratch(q.cols, a.chunks);
  for (std::int64_t c = n0; c < n1; c += kPanel) {
    const std::int64_t nvalid = std::min(kPanel, n1 - c);
#if DG_X86_KERNELS
    if (form != Form::kScalar) {
      if (form == Form::kAvx512Vnni) {
        avx512vnni::unpack_panel(q, c, a.chunks, p);
        avx512vnni::panel_product(a, p, nvalid, y + c, ldy, accumulate);
      } else {
        avx2::unpack_panel(q, c, a.chunks, p);
        avx2::panel_product(a, p, nvalid, y + c, ldy, accumulate);
      }
      continue;
    }
#endif
    unpack_panel_scalar(q, c, a.chunks, p);
    panel_product_scalar(a, p, nvalid, y + c, ldy, accumulate);
  }
}

}  // namespace diffusion_gemma::cpu::kernels::int8
