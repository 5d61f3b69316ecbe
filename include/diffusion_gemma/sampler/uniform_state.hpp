// SPDX-License-Identifier: Apache-2.0
// Corruption state of uniform-state diffusion: canvases start as i.i.d. uniform tokens over the
// whole vocabulary (no mask token), and every non-accepted position is renoised the same way.
#pragma once

#include <cstdint>

#include <diffusion_gemma/core/rng.hpp>

namespace diffusion_gemma {

struct UniformState {
  struct Arguments {};

  template <class Rng>
  static void init(const Rng& rng, int canvas, std::int64_t vocab, std::int32_t* out, int length) {
    for (int i = 0; i < length; ++i) out[i] = rng.token(DrawPurpose::kInit, canvas, 0, i, vocab);
  }
  template <class Rng>
  static std::int32_t renoise(const Rng& rng, int canvas, int step, int position, std::int64_t vocab) {
    return rng.token(DrawPurpose::kRenoise, canvas, step, position, vocab);
  }
};

}  // namespace diffusion_gemma
