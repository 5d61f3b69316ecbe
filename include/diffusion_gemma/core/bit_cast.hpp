// SPDX-License-Identifier: Apache-2.0
// float <-> uint32 reinterpretation without type punning through pointers (valid C++17 and CUDA).
#pragma once

#include <cstdint>
#include <cstring>

#include <diffusion_gemma/core/macros.hpp>

namespace diffusion_gemma {

DG_HOST_DEVICE std::uint32_t float_bits(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  std::uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
#endif
}

DG_HOST_DEVICE float bits_to_float(std::uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
#endif
}

}  // namespace diffusion_gemma
