// SPDX-License-Identifier: Apache-2.0
// Per-element arithmetic of quantized weights (docs/quantization.md), written once for host and
// device: decoding FP8 E4M3, unpacking integers from 32-bit words, and the dequantisation
// (q - zero) * scale rounded to the scale's dtype, which is how compressed-tensors and GPTQModel
// compute it (in the scale's dtype), so a dequantised weight here equals theirs bit for bit.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#include <diffusion_gemma/core/bfloat16.hpp>
#include <diffusion_gemma/core/bit_cast.hpp>
#include <diffusion_gemma/core/dtype.hpp>
#include <diffusion_gemma/core/float16.hpp>
#include <diffusion_gemma/core/macros.hpp>

namespace diffusion_gemma::quant {

// FP8 E4M3 as torch's float8_e4m3fn: bias 7, no infinities, S.1111.111 is NaN, largest 448.
DG_HOST_DEVICE float fp8_e4m3_to_float(std::uint8_t b) {
  const std::uint32_t sign = static_cast<std::uint32_t>(b & 0x80u) << 24;
  const std::uint32_t exponent = (b >> 3) & 0xFu, mantissa = b & 0x7u;
  if (exponent == 0xFu && mantissa == 0x7u) return bits_to_float(sign | 0x7fc00000u);
  if (exponent == 0) {
    // Subnormal: mantissa * 2^-9, exact in float.
    const float v = static_cast<float>(mantissa) * (1.0f / 512.0f);
    return sign ? -v : v;
  }
  return bits_to_float(sign | ((exponent + 120u) << 23) | (mantissa << 20));
}

// The nearest FP8 E4M3 value (ties to even), saturating at +-448 as compressed-tensors clamps
// before it casts. NaN stays NaN.
DG_HOST_DEVICE std::uint8_t float_to_fp8_e4m3(float f) {
  const std::uint32_t u = float_bits(f);
  const std::uint8_t sign = static_cast<std::uint8_t>((u >> 24) & 0x80u);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<std::uint8_t>(sign | 0x7Fu);
  const std::uint32_t a = u & 0x7fffffffu;
  if (a >= 0x43E00000u) return static_cast<std::uint8_t>(sign | 0x7Eu);  // >= 448
  const std::int32_t e = static_cast<std::int32_t>(a >> 23) - 127;
  if (e < -6) {
    // Subnormal range: steps of 2^-9. Round |f| * 512 to nearest even; a result of 8 is the
    // smallest normal number, whose code is also 8.
    const float scaled = bits_to_float(a) * 512.0f;
    std::uint32_t q = static_cast<std::uint32_t>(scaled);
    const float rest = scaled - static_cast<float>(q);
    if (rest > 0.5f || (rest == 0.5f && (q & 1u))) ++q;
    return static_cast<std::uint8_t>(sign | q);
  }
  // Normal: keep 3 of the 23 mantissa bits, round to nearest even on the 20 dropped.
  std::uint32_t mantissa = (a & 0x7fffffu) >> 20;
  const std::uint32_t dropped = a & 0xfffffu;
  std::uint32_t exponent = static_cast<std::uint32_t>(e + 7);
  if (dropped > 0x80000u || (dropped == 0x80000u && (mantissa & 1u))) {
    if (++mantissa == 8u) {
      mantissa = 0;
      ++exponent;
    }
  }
  return static_cast<std::uint8_t>(sign | (exponent << 3) | mantissa);
}

// Little-endian 32-bit word i at `base`, which a checkpoint may leave unaligned.
DG_HOST_DEVICE std::uint32_t load_word(const void* base, std::int64_t i) {
  std::uint32_t w;
  std::memcpy(&w, static_cast<const unsigned char*>(base) + i * 4, 4);
  return w;
}

// Element i of an array of `bits`-wide unsigned fields packed least significant first into
// 32-bit words (bits divides 32).
DG_HOST_DEVICE std::uint32_t unpack_field(const void* words, std::int64_t i, int bits) {
  const int per_word = 32 / bits;
  const std::uint32_t mask = (1u << bits) - 1u;
  return (load_word(words, i / per_word) >> (bits * static_cast<int>(i % per_word))) & mask;
}

// float -> the scale's dtype -> float: the rounding of a product computed in that dtype.
DG_HOST_DEVICE float round_to(DType t, float v) {
  if (t == DType::kBF16) return round_to_bfloat16(v);
  if (t == DType::kF16) return float16::from_float(v).to_float();
  return v;
}

// One dequantised weight: (q - zero) * scale, computed as the reference computes it. q - zero is
// an exact small integer in every dtype this is used with (|q - zero| < 2^8).
DG_HOST_DEVICE float dequantize(float q_minus_zero, float scale, DType scale_dtype) {
  return round_to(scale_dtype, q_minus_zero * scale);
}

// Activations rounded to 8-bit integers for the fast precision's integer products
// (cpu/kernels/int8_products.hpp): a = scale * (code - 128), scale = max |a| / 127 over the
// values that share it. The code is rounded to nearest, ties to even (rintf, as cvtps2dq does);
// NaN becomes -127, as the vector conversion's out-of-range value clamps there.
DG_HOST_DEVICE float activation_scale(float absmax) { return absmax / 127.0f; }
// 0 also where 127 / absmax overflows (absmax below about 3.7e-37): an infinite inverse would turn
// the zeros of that chunk into NaN, which clamps to -127; with 0 every code is 0.
DG_HOST_DEVICE float activation_inverse_scale(float absmax) {
  const float inv = absmax > 0.0f ? 127.0f / absmax : 0.0f;
  return inv < INFINITY ? inv : 0.0f;
}
DG_HOST_DEVICE std::uint8_t activation_code(float a, float inverse_scale) {
  const float t = rintf(a * inverse_scale);
  const int v = (t >= -127.0f && t <= 127.0f) ? static_cast<int>(t) : (t > 127.0f ? 127 : -127);
  return static_cast<std::uint8_t>(v + 128);
}

}  // namespace diffusion_gemma::quant
