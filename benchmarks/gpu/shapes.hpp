// SPDX-License-Identifier: Apache-2.0
// Model configurations of the GPU programs, without a checkpoint: the released 26B-A4B widths
// (docs/model.md §1.1) and a smaller model of the same vocabulary and canvas. Host code only.
#pragma once

#include <string>

#include <diffusion_gemma/core/status.hpp>
#include <diffusion_gemma/model/config.hpp>

namespace dg_gpu {

// "real": hidden 2816, 16 query heads, head dims 256 (sliding) / 512 (full, K = V), 128 experts
// top-8 of width 704, dense width 2112, vocabulary 262,144, canvas 256, window 1024, 30 layers.
// "small": hidden 1024, 32 experts top-4, 6 layers, same vocabulary and canvas.
// `layers` > 0 keeps the widths and changes the depth; the Gemma 4 pattern (five sliding layers,
// then a full one, the last layer always full) is kept, so any depth has both kinds from 2 on.
inline diffusion_gemma::ModelConfig synthetic_config(const std::string& name, int layers = 0) {
  using namespace diffusion_gemma;
  ModelConfig c;
  c.family = ModelFamily::kDiffusionGemma;
  c.source = "synthetic:" + name;
  c.vocab_size = 262144;
  c.canvas_length = 256;
  c.sliding_window = 1024;
  c.max_position_embeddings = 262144;
  c.final_logit_softcapping = 30.0f;
  c.enable_moe_block = true;
  c.rope_sliding = RopeConfig{};
  c.rope_full.type = RopeConfig::Type::kProportional;
  c.rope_full.theta = 1e6;
  c.rope_full.partial_rotary_factor = 0.25;
  c.eos_token_ids = {1, 106, 50};
  int depth = 0, sliding_kv = 0, full_kv = 0;
  if (name == "small") {
    c.hidden_size = 1024;
    c.intermediate_size = 2048;
    c.num_heads = 8;
    c.num_experts = 32;
    c.top_k_experts = 4;
    c.moe_intermediate_size = 256;
    depth = 6;
    sliding_kv = 4;
    full_kv = 1;
  } else if (name == "real") {
    c.hidden_size = 2816;
    c.intermediate_size = 2112;
    c.num_heads = 16;
    c.num_experts = 128;
    c.top_k_experts = 8;
    c.moe_intermediate_size = 704;
    depth = 30;
    sliding_kv = 8;
    full_kv = 2;
  } else {
    throw_error(StatusCode::kInvalidArgument, "synthetic configuration '", name, "': small or real");
  }
  if (layers > 0) depth = layers;
  for (int l = 0; l < depth; ++l) {
    LayerSpec s;
    const bool full = l % 6 == 5 || l == depth - 1;
    s.type = full ? LayerType::kFull : LayerType::kSliding;
    s.head_dim = full ? 512 : 256;
    s.num_kv_heads = full ? full_kv : sliding_kv;
    s.has_v_proj = !full;  // attention_k_eq_v on full layers
    c.layers.push_back(s);
  }
  c.validate();
  return c;
}

}  // namespace dg_gpu
