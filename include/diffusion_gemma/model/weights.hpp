// SPDX-License-Identifier: Apache-2.0
// The tensors of a Gemma 4 / DiffusionGemma backbone as stored (any of F32, F16, BF16), as views
// into the checkpoint. io/weights.hpp fills it from tensor names; back-ends convert or upload it.
#pragma once

#include <vector>

#include <diffusion_gemma/core/tensor_view.hpp>

namespace diffusion_gemma {

struct LayerWeights {
  // Attention. v_proj is empty on layers where V is taken from k_proj (attention_k_eq_v).
  RawTensor q_proj, k_proj, v_proj, o_proj;  // [out, in]
  RawTensor q_norm, k_norm;                  // [head_dim]
  // The seven per-layer RMSNorm weights (plain w, not 1 + w).
  RawTensor input_layernorm, post_attention_layernorm;
  RawTensor pre_feedforward_layernorm, post_feedforward_layernorm;
  RawTensor post_feedforward_layernorm_1, pre_feedforward_layernorm_2, post_feedforward_layernorm_2;  // MoE only
  // Dense GeGLU MLP ("shared expert").
  RawTensor mlp_gate, mlp_up, mlp_down;
  // Router and experts (MoE only).
  RawTensor router_proj;              // [E, H]
  RawTensor router_scale;             // [H]
  RawTensor router_per_expert_scale;  // [E]
  RawTensor experts_gate_up;          // [E, 2I, H], gate rows first
  RawTensor experts_down;             // [E, H, I]
  RawTensor layer_scalar;             // [1]
};

struct SelfConditioningWeights {
  RawTensor pre_norm;                // [H]
  RawTensor gate_proj, up_proj;      // [I, H]
  RawTensor down_proj;               // [H, I]
  bool present() const { return !pre_norm.empty(); }
};

struct ModelWeights {
  RawTensor embed_tokens;  // [V, H]; also the tied LM head
  RawTensor final_norm;    // [H]
  std::vector<LayerWeights> layers;
  SelfConditioningWeights self_conditioning;  // DiffusionGemma only
};

}  // namespace diffusion_gemma
