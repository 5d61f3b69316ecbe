// SPDX-License-Identifier: Apache-2.0
// The Gemma 4 router of one token on the device: softmax over the expert logits in the CPU
// engine's order of operations, then math::router_top_k (top-k by probability, lower expert on
// ties, renormalise, times per_expert_scale), so that both back-ends route identically.
#pragma once

#include <diffusion_gemma/core/macros.hpp>
#include <diffusion_gemma/core/math.hpp>

namespace diffusion_gemma::cuda {

// One thread routes one token. `probs` is E floats of scratch (local or shared memory).
DG_DEVICE void route_token(const float* logits, int num_experts, int k, const float* per_expert_scale, float* probs,
                           float* weights, int* indices) {
  float m = logits[0];
  for (int e = 1; e < num_experts; ++e) m = m < logits[e] ? logits[e] : m;  // std::max(m, x)
  float sum = 0.0f;
  for (int e = 0; e < num_experts; ++e) {
    probs[e] = expf(logits[e] - m);
    sum += probs[e];
  }
  for (int e = 0; e < num_experts; ++e) probs[e] /= sum;
  math::router_top_k(probs, per_expert_scale, num_experts, k, weights, indices);
}

}  // namespace diffusion_gemma::cuda
