// SPDX-License-Identifier: Apache-2.0
// Self-conditioning policies. SelfConditioning feeds the previous step's soft embedding
// softmax(l/T) E sqrt(H) (computed inside the vocabulary pass, never as [C, V]) into the next
// denoiser pass; it is zero on the first step of every canvas. NoConditioning never feeds it.
#pragma once

namespace diffusion_gemma {

struct SelfConditioning {
  struct Arguments {};
  static constexpr bool kEnabled = true;
};

struct NoConditioning {
  struct Arguments {};
  static constexpr bool kEnabled = false;
};

}  // namespace diffusion_gemma
