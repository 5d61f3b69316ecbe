// SPDX-License-Identifier: Apache-2.0
// bfloat16 storage type: the upper 16 bits of an IEEE float. Conversion from float rounds to
// nearest even (as torch and the CUDA intrinsics do); conversion to float is exact.
#pragma once

#include <cstdint>

#include <diffusion_gemma/core/bit_cast.hpp>
#include <diffusion_gemma/core/macros.hpp>

namespace diffusion_gemma {

struct bfloat16 {
  std::uint16_t bits = 0;

  static DG_HOST_DEVICE bfloat16 from_bits(std::uint16_t b) {
    bfloat16 h;
    h.bits = b;
    return h;
  }

  static DG_HOST_DEVICE bfloat16 from_float(float f) {
    const std::uint32_t u = float_bits(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) {
      // NaN: keep the sign, force a quiet-NaN payload so truncation cannot turn it into Inf.
      return from_bits(static_cast<std::uint16_t>((u >> 16) | 0x0040u));
    }
    const std::uint32_t rounding_bias = 0x7fffu + ((u >> 16) & 1u);
    return from_bits(static_cast<std::uint16_t>((u + rounding_bias) >> 16));
  }

  DG_HOST_DEVICE float to_float() const { return bits_to_float(static_cast<std::uint32_t>(bits) << 16); }
};

DG_HOST_DEVICE float to_float(bfloat16 h) { return h.to_float(); }

// Rounds a float to the nearest bfloat16 value and back: what a torch `.to(bfloat16)` does.
DG_HOST_DEVICE float round_to_bfloat16(float f) { return bfloat16::from_float(f).to_float(); }

}  // namespace diffusion_gemma
