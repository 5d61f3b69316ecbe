// SPDX-License-Identifier: Apache-2.0
// What the vocabulary pass of a denoising step is asked for and returns, per canvas position.
// Back-end neutral: cpu/vocab_pass.hpp and the CUDA pass fill the same structs.
#pragma once

#include <cstdint>
#include <vector>

#include <diffusion_gemma/core/rng.hpp>

namespace diffusion_gemma {

// Candidates are sampled per chunk of this many vocabulary ids (see cpu/vocab_pass.hpp); part of
// the sampling algorithm's definition, so every back-end uses the same chunks and draws.
inline constexpr std::int64_t kSampleChunk = 256;

struct VocabPassArgs {
  float temperature = 1.0f;
  bool soft_embedding = true;  // accumulate sum_i p_i E_i (self-conditioning)
  bool sample = true;          // draw a categorical candidate per position
  DrawKey key;                 // seed, canvas, step of the draws
};

// Per-position results of a pass over C positions.
struct VocabPassResult {
  std::vector<std::int32_t> argmax;   // first index of the largest logit
  std::vector<std::int32_t> sample;   // categorical draw from softmax(l / T); -1 when not sampled
  std::vector<float> entropy;         // nats, of softmax(l / T)
  std::vector<float> soft_embedding;  // [C, H]: softmax(l / T) E * embed_scale
  void resize(std::int64_t C, std::int64_t H, bool soft) {
    argmax.resize(static_cast<std::size_t>(C));
    sample.resize(static_cast<std::size_t>(C));
    entropy.resize(static_cast<std::size_t>(C));
    if (soft) soft_embedding.resize(static_cast<std::size_t>(C * H));
  }
};

}  // namespace diffusion_gemma
