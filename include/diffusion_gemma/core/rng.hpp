// SPDX-License-Identifier: Apache-2.0
// Counter-based random numbers (Philox4x32-10, Salmon et al. 2011). A draw is a pure function of
// (seed, canvas, step, position, purpose, index), so it does not depend on thread count, batch
// composition or back-end: the CPU and the GPU draw identical numbers.
#pragma once

#include <cstdint>

#include <diffusion_gemma/core/macros.hpp>

namespace diffusion_gemma {

struct Philox4x32 {
  std::uint32_t v[4];
};

DG_HOST_DEVICE void philox_mulhilo(std::uint32_t a, std::uint32_t b, std::uint32_t* hi, std::uint32_t* lo) {
  const std::uint64_t p = static_cast<std::uint64_t>(a) * b;
  *hi = static_cast<std::uint32_t>(p >> 32);
  *lo = static_cast<std::uint32_t>(p);
}

DG_HOST_DEVICE Philox4x32 philox4x32_10(Philox4x32 ctr, std::uint32_t k0, std::uint32_t k1) {
  for (int round = 0; round < 10; ++round) {
    std::uint32_t hi0, lo0, hi1, lo1;
    philox_mulhilo(0xD2511F53u, ctr.v[0], &hi0, &lo0);
    philox_mulhilo(0xCD9E8D57u, ctr.v[2], &hi1, &lo1);
    ctr = Philox4x32{{hi1 ^ ctr.v[1] ^ k0, lo1, hi0 ^ ctr.v[3] ^ k1, lo0}};
    k0 += 0x9E3779B9u;
    k1 += 0xBB67AE85u;
  }
  return ctr;
}

// What a draw is for; part of the counter so that streams never overlap.
enum class DrawPurpose : std::uint32_t { kInit = 1, kSample = 2, kRenoise = 3, kUser = 8 };

struct DrawKey {
  std::uint64_t seed = 0;
  std::uint32_t canvas = 0;  // < 2^24
  std::uint32_t step = 0;    // 0-based step within the canvas
};

DG_HOST_DEVICE Philox4x32 draw(const DrawKey& key, DrawPurpose purpose, std::uint32_t position, std::uint32_t index) {
  const Philox4x32 ctr{{index, position, key.step,
                        (key.canvas & 0x00FFFFFFu) | (static_cast<std::uint32_t>(purpose) << 24)}};
  return philox4x32_10(ctr, static_cast<std::uint32_t>(key.seed), static_cast<std::uint32_t>(key.seed >> 32));
}

// Uniform float in the open interval (0, 1) from 23 random bits: exact in fp32, never 0 or 1.
DG_HOST_DEVICE float uniform_open01(std::uint32_t bits) {
  return (static_cast<float>(bits >> 9) + 0.5f) * (1.0f / 8388608.0f);
}

// Uniform integer in [0, n) by multiply-high (unbiased when n is a power of two, as Gemma's
// vocabulary is; bias below 2^-32 * n otherwise).
DG_HOST_DEVICE std::uint32_t uniform_below(std::uint32_t bits, std::uint32_t n) {
  return static_cast<std::uint32_t>((static_cast<std::uint64_t>(bits) * n) >> 32);
}

}  // namespace diffusion_gemma
