// SPDX-License-Identifier: Apache-2.0
// The model arithmetic of a pass, counted from the config (multiply-add = 2): what a benchmark
// divides by its time to print achieved GFLOP/s next to the CPU's measured peak (peak.hpp).
#pragma once

#include <algorithm>
#include <cstdint>

#include <diffusion_gemma/model/config.hpp>

namespace dg_bench {

// Model FLOPs of a pass over T tokens at positions p0.. (multiply-add = 2), counting the keys each
// query sees (docs/model.md §5) and, for a denoising step, the self-conditioning MLP. An encoder
// pass that only fills the cache (prefill, commit) computes no more than the K/V projections of its
// last layer (cpu/engine.hpp), and only that is counted there.
inline double pass_flops(const diffusion_gemma::ModelConfig& c, std::int64_t T, std::int64_t p0, bool denoise, bool soft) {
  const double H = c.hidden_size, I = c.intermediate_size, Hq = c.num_heads;
  double f = 0.0;
  for (const auto& s : c.layers) {
    const double D = s.head_dim, kv = s.num_kv_heads * D;
    if (!denoise && &s == &c.layers.back()) {
      f += 2.0 * T * H * kv * (s.has_v_proj ? 2 : 1);  // k, v
      break;
    }
    f += 2.0 * T * H * (Hq * D + kv * (s.has_v_proj ? 2 : 1)) + 2.0 * T * Hq * D * H;  // q, k, v, o
    f += 2.0 * T * 3.0 * H * I;                                                       // dense MLP
    if (c.enable_moe_block) {
      f += 2.0 * T * H * c.num_experts + 2.0 * T * c.top_k_experts * 3.0 * H * c.moe_intermediate_size;
    }
    double keys = 0.0;
    for (std::int64_t i = 0; i < T; ++i) {
      const std::int64_t q = p0 + i;
      if (denoise) {
        keys += static_cast<double>(T + (s.type == diffusion_gemma::LayerType::kFull ? p0 : std::min<std::int64_t>(p0, c.sliding_window - 1)));
      } else {
        keys += static_cast<double>(s.type == diffusion_gemma::LayerType::kFull ? q + 1 : std::min<std::int64_t>(q + 1, c.sliding_window));
      }
    }
    f += 4.0 * Hq * D * keys;  // scores and values
  }
  if (denoise && soft) f += 2.0 * T * 3.0 * H * I;
  return f;
}


// The vocabulary pass of a denoising step over T rows: the LM head's logits and the soft
// embedding (the probabilities times the embedding matrix) the next step reads.
inline double vocab_pass_flops(const diffusion_gemma::ModelConfig& c, std::int64_t T) {
  return 4.0 * static_cast<double>(T) * static_cast<double>(c.vocab_size) * static_cast<double>(c.hidden_size);
}

}  // namespace dg_bench
