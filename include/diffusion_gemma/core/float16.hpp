// SPDX-License-Identifier: Apache-2.0
// IEEE 754 binary16 storage type with exact widening and round-to-nearest-even narrowing,
// written in integer arithmetic so it behaves the same on every host and device.
#pragma once

#include <cstdint>

#include <diffusion_gemma/core/bit_cast.hpp>
#include <diffusion_gemma/core/macros.hpp>

namespace diffusion_gemma {

struct float16 {
  std::uint16_t bits = 0;

  static DG_HOST_DEVICE float16 from_bits(std::uint16_t b) {
    float16 h;
    h.bits = b;
    return h;
  }

  DG_HOST_DEVICE float to_float() const {
    const std::uint32_t sign = static_cast<std::uint32_t>(bits & 0x8000u) << 16;
    const std::uint32_t exponent = (bits >> 10) & 0x1fu;
    std::uint32_t mantissa = bits & 0x3ffu;
    if (exponent == 0x1fu) {  // Inf or NaN
      return bits_to_float(sign | 0x7f800000u | (mantissa << 13));
    }
    if (exponent != 0) {  // normal
      return bits_to_float(sign | ((exponent + 112u) << 23) | (mantissa << 13));
    }
    if (mantissa == 0) return bits_to_float(sign);  // signed zero
    // Subnormal half: normalise into a float, which has the range to hold it exactly.
    std::uint32_t e = 113u;
    while ((mantissa & 0x400u) == 0) {
      mantissa <<= 1;
      --e;
    }
    return bits_to_float(sign | (e << 23) | ((mantissa & 0x3ffu) << 13));
  }

  static DG_HOST_DEVICE float16 from_float(float f) {
    const std::uint32_t u = float_bits(f);
    const std::uint16_t sign = static_cast<std::uint16_t>((u >> 16) & 0x8000u);
    const std::uint32_t abs = u & 0x7fffffffu;
    if (abs > 0x7f800000u) return from_bits(static_cast<std::uint16_t>(sign | 0x7e00u));  // NaN
    if (abs >= 0x477ff000u) return from_bits(static_cast<std::uint16_t>(sign | 0x7c00u));  // overflow -> Inf
    const std::int32_t exp32 = static_cast<std::int32_t>(abs >> 23);
    if (exp32 < 113) {
      // Result is subnormal (or zero): shift the full 24-bit significand and round to even.
      if (exp32 < 102) return from_bits(sign);  // below half the smallest subnormal
      const std::uint32_t significand = (abs & 0x7fffffu) | 0x800000u;
      const int shift = 126 - exp32;  // 14..24
      std::uint32_t half = significand >> shift;
      const std::uint32_t rem = significand & ((1u << shift) - 1u);
      const std::uint32_t halfway = 1u << (shift - 1);
      if (rem > halfway || (rem == halfway && (half & 1u))) ++half;
      return from_bits(static_cast<std::uint16_t>(sign | half));
    }
    std::uint32_t half = ((static_cast<std::uint32_t>(exp32) - 112u) << 10) | ((abs >> 13) & 0x3ffu);
    const std::uint32_t rem = abs & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (half & 1u))) ++half;  // may carry into the exponent: correct
    return from_bits(static_cast<std::uint16_t>(sign | half));
  }
};

DG_HOST_DEVICE float to_float(float16 h) { return h.to_float(); }

}  // namespace diffusion_gemma
