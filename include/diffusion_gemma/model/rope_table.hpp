// SPDX-License-Identifier: Apache-2.0
// The RoPE inverse frequencies of a model, computed once on the host with math::rope_inv_freq.
// Both back-ends read these very bits (the CUDA engine uploads them instead of calling powf per
// element on the device), so the angle pos * inv_freq[i] is the same fp32 product on either; at
// positions of 1e4-1e5 a few ulps of inv_freq would otherwise become 1e-3..1e-2 rad.
#pragma once

#include <cstddef>
#include <utility>
#include <vector>

#include <diffusion_gemma/core/math.hpp>
#include <diffusion_gemma/model/config.hpp>

namespace diffusion_gemma {

// inv_freq [head_dim / 2] of one RoPE configuration (0 for the pairs it leaves unrotated).
inline std::vector<float> rope_inv_freq_table(const RopeConfig& rope, int head_dim) {
  const int pairs = rope.rotated_pairs(head_dim), denom = rope.denominator(head_dim);
  std::vector<float> inv(static_cast<std::size_t>(head_dim / 2));
  for (int i = 0; i < head_dim / 2; ++i) {
    inv[static_cast<std::size_t>(i)] =
        math::rope_inv_freq(i, pairs, denom, static_cast<float>(rope.theta), static_cast<float>(rope.factor));
  }
  return inv;
}

// One table per distinct (layer type, head_dim) of a model, concatenated; layers point into it.
struct RopeTables {
  std::vector<float> inv_freq;            // every table, head_dim / 2 entries each
  std::vector<std::size_t> layer_offset;  // [num_layers]: start of layer l's table in inv_freq

  const float* layer(int l) const { return inv_freq.data() + layer_offset[static_cast<std::size_t>(l)]; }

  static RopeTables build(const ModelConfig& cfg) {
    RopeTables t;
    std::vector<std::pair<LayerType, int>> made;  // the key of each table, in order
    std::vector<std::size_t> made_at;
    t.layer_offset.reserve(cfg.layers.size());
    for (const LayerSpec& s : cfg.layers) {
      std::size_t k = 0;
      while (k < made.size() && made[k] != std::make_pair(s.type, s.head_dim)) ++k;
      if (k == made.size()) {
        made.emplace_back(s.type, s.head_dim);
        made_at.push_back(t.inv_freq.size());
        const std::vector<float> table = rope_inv_freq_table(cfg.rope(s.type), s.head_dim);
        t.inv_freq.insert(t.inv_freq.end(), table.begin(), table.end());
      }
      t.layer_offset.push_back(made_at[k]);
    }
    return t;
  }
};

}  // namespace diffusion_gemma
