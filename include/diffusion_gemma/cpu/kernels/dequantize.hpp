// SPDX-License-Identifier: Apache-2.0
// Unpacks a block of rows of a quantized matrix into the numbers the product kernels read. The
// block is small (a few hundred KiB, in a per-thread buffer that stays in L2) and is used at once
// by the kernel for every activation row, so a quantized weight is read from memory once per
// product and no full-precision copy of a matrix ever exists.
//
// The numbers are in the scale's dtype (BF16, F16 or F32), rounded as the reference rounds
// (core/quant.hpp): with BF16 scales the AMX tiles take them as they are, and the exact kernels
// widen them exactly, so both precisions compute with the reference's dequantised weights.
#pragma once

#include <cstdint>
#include <cstring>

#include <diffusion_gemma/core/quant.hpp>
#include <diffusion_gemma/model/quantized_matrix.hpp>

namespace diffusion_gemma::cpu::kernels {

namespace detail {

template <DType S>
struct ScaleType;
template <> struct ScaleType<DType::kF32> { using type = float; };
template <> struct ScaleType<DType::kBF16> { using type = bfloat16; };
template <> struct ScaleType<DType::kF16> { using type = float16; };

template <DType S>
inline float scale_at(const std::byte* base, std::int64_t i) {
  typename ScaleType<S>::type v;
  std::memcpy(&v, base + i * static_cast<std::int64_t>(sizeof(v)), sizeof(v));
  if constexpr (S == DType::kF32) {
    return v;
  } else {
    return v.to_float();
  }
}

// Stores an already rounded value in the scale's dtype (exact: no second rounding).
template <DType S>
inline void store(std::byte* out, std::int64_t i, float v) {
  if constexpr (S == DType::kF32) {
    std::memcpy(out + i * 4, &v, 4);
  } else {
    const std::uint16_t bits = S == DType::kBF16 ? bfloat16::from_float(v).bits : float16::from_float(v).bits;
    std::memcpy(out + i * 2, &bits, 2);
  }
}

// Words of an I32 tensor, read with quant::load_word (the file may leave them unaligned).
inline const std::byte* words(const RawTensor& t) { return t.data; }
inline std::int32_t int32_at(const RawTensor& t, std::int64_t i) { return static_cast<std::int32_t>(quant::load_word(t.data, i)); }

// The scale of (row r, input column c) for the compressed-tensors formats.
template <DType S>
inline float ct_scale(const QuantizedMatrix& q, std::int64_t r, std::int64_t c) {
  if (q.group_size < 0) return scale_at<S>(q.scale.data, 0);
  if (q.group_size == 0) return scale_at<S>(q.scale.data, r);
  return scale_at<S>(q.scale.data, r * q.groups() + c / q.group_size);
}

// What a packed field of (row r, group gi) has subtracted from it: the storage offset 2^(bits-1),
// plus the zero point when asymmetric (zero points are packed along the output dimension,
// [ceil(out*bits/32), groups]).
inline float packed_zero(const QuantizedMatrix& q, std::int64_t r, std::int64_t gi, std::int64_t groups) {
  const float offset = static_cast<float>(1 << (q.bits - 1));
  if (q.zero_point.empty()) return offset;
  const std::int64_t per = 32 / q.bits;
  return static_cast<float>(quant::unpack_field(q.zero_point.data + ((r / per) * groups + gi) * 4, r % per, q.bits));
}

template <DType S>
void dequantize_rows_typed(const QuantizedMatrix& q, std::int64_t r0, std::int64_t n, std::byte* out) {
  const std::int64_t K = q.cols;
  switch (q.format) {
    case QuantFormat::kFp8:
    case QuantFormat::kInt8: {
      const bool fp8 = q.format == QuantFormat::kFp8;
      for (std::int64_t r = 0; r < n; ++r) {
        const std::uint8_t* row = reinterpret_cast<const std::uint8_t*>(q.values.data) + (r0 + r) * K;
        for (std::int64_t c = 0; c < K; ++c) {
          const float v = fp8 ? quant::fp8_e4m3_to_float(row[c]) : static_cast<float>(static_cast<std::int8_t>(row[c]));
          store<S>(out, r * K + c, quant::dequantize(v, ct_scale<S>(q, r0 + r, c), S));
        }
      }
      return;
    }
    case QuantFormat::kPacked: {
      const int b = q.bits;
      const std::int64_t row_words = (K * b + 31) / 32;
      const std::int64_t G = q.groups();
      const std::int64_t g = q.group_size > 0 ? q.group_size : K;
      for (std::int64_t r = 0; r < n; ++r) {
        const std::int64_t R = r0 + r;
        const std::byte* row = words(q.values) + R * row_words * 4;
        for (std::int64_t c0 = 0; c0 < K; c0 += g) {
          const std::int64_t gi = c0 / g, c1 = c0 + g < K ? c0 + g : K;
          const float s = ct_scale<S>(q, R, c0);
          const float zero = packed_zero(q, R, gi, G);
          for (std::int64_t c = c0; c < c1; ++c) {
            const float v = static_cast<float>(quant::unpack_field(row, c, b)) - zero;
            store<S>(out, r * K + c, quant::dequantize(v, s, S));
          }
        }
      }
      return;
    }
    case QuantFormat::kGptq: {
      const int b = q.bits, per = 32 / b;
      const std::int64_t N = q.rows, zero_words = (N * b + 31) / 32;
      for (std::int64_t c = 0; c < K; ++c) {
        const std::int64_t grp = !q.g_idx.empty() ? int32_at(q.g_idx, c) : (q.group_size > 0 ? c / q.group_size : 0);
        const std::byte* qrow = words(q.values) + (c / per) * N * 4;
        const std::byte* zrow = words(q.zero_point) + grp * zero_words * 4;
        const int shift = b * static_cast<int>(c % per);
        const std::uint32_t mask = (1u << b) - 1u;
        for (std::int64_t r = 0; r < n; ++r) {
          const std::int64_t R = r0 + r;
          const float value = static_cast<float>((quant::load_word(qrow, R) >> shift) & mask);
          const float zero = static_cast<float>(quant::unpack_field(zrow, R, b)) + static_cast<float>(q.zero_offset);
          store<S>(out, r * K + c, quant::dequantize(value - zero, scale_at<S>(q.scale.data, grp * N + R), S));
        }
      }
      return;
    }
    case QuantFormat::kSentinel: break;
  }
}

}  // namespace detail

// Rows [r0, r0 + n) of `q` as a row-major [n, cols] block of q.scale_dtype() numbers at `out`.
inline void dequantize_rows(const QuantizedMatrix& q, std::int64_t r0, std::int64_t n, std::byte* out) {
  switch (q.scale_dtype()) {
    case DType::kBF16: return detail::dequantize_rows_typed<DType::kBF16>(q, r0, n, out);
    case DType::kF16: return detail::dequantize_rows_typed<DType::kF16>(q, r0, n, out);
    default: return detail::dequantize_rows_typed<DType::kF32>(q, r0, n, out);
  }
}

}  // namespace diffusion_gemma::cpu::kernels
