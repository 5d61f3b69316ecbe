// SPDX-License-Identifier: Apache-2.0
// What one batched engine pass is asked to do for each sequence in it (docs/serving.md, "How a
// batch runs"). Every sequence brings its own KV cache, its own positions (cache->length()..), its
// own canvas length, sampling key and self-conditioning state, so a pass over several sequences
// computes for each exactly what a pass over it alone would: the weights are read once for all.
#pragma once

#include <cstdint>

#include <diffusion_gemma/sampler/vocab_stats.hpp>

namespace diffusion_gemma {

// A causal pass (prompt prefill or canvas commit): appends the K/V of `n` tokens to `cache`.
template <class Cache>
struct EncodeItem {
  const std::int32_t* ids = nullptr;
  std::int64_t n = 0;
  Cache* cache = nullptr;
};

// One denoising step of a canvas: the denoiser pass plus the vocabulary pass into `stats`.
// `state` carries the sequence's self-conditioning input from its previous step to the next
// (ignored and reset when `first_step`).
template <class Cache, class DenoiseState>
struct DenoiseItem {
  const std::int32_t* canvas = nullptr;
  std::int64_t n = 0;
  bool first_step = true;
  const Cache* cache = nullptr;
  VocabPassArgs args{};
  VocabPassResult* stats = nullptr;
  DenoiseState* state = nullptr;
};

}  // namespace diffusion_gemma
