// SPDX-License-Identifier: Apache-2.0
// The tensors of a Gemma 4 / DiffusionGemma backbone (docs/model.md §7) as Weight views in the
// checkpoint's dtype. io/weights.hpp fills them from a checkpoint; the CPU back-end computes with
// them in place and the CUDA back-end uploads them.
//
// for_each_parameter() is the one list of those tensors: their names under the backbone prefix,
// the shapes a config implies, and which struct member holds each. Binding, upload, memory
// accounting and tests all walk it instead of naming tensors again.
#pragma once

#include <cmath>
#include <string>
#include <vector>

#include <diffusion_gemma/core/bfloat16.hpp>
#include <diffusion_gemma/core/float16.hpp>
#include <diffusion_gemma/model/config.hpp>
#include <diffusion_gemma/model/weight.hpp>

namespace diffusion_gemma {

struct LayerWeights {
  // Attention. v_proj is empty on layers where V is taken from k_proj (attention_k_eq_v).
  Weight q_proj, k_proj, v_proj, o_proj;  // [out, in]
  Weight q_norm, k_norm;                  // [head_dim]
  // The seven per-layer RMSNorm weights (plain w, not 1 + w).
  Weight input_layernorm, post_attention_layernorm;
  Weight pre_feedforward_layernorm, post_feedforward_layernorm;
  Weight post_feedforward_layernorm_1, pre_feedforward_layernorm_2, post_feedforward_layernorm_2;  // MoE only
  // Dense GeGLU MLP ("shared expert").
  Weight mlp_gate, mlp_up, mlp_down;
  // Router and experts (MoE only).
  Weight router_proj;              // [E, H]
  Weight router_scale;             // [H]
  Weight router_per_expert_scale;  // [E]
  Weight experts_gate_up;          // [E, 2I, H], gate rows first
  Weight experts_down;             // [E, H, I]
  Weight layer_scalar;             // [1]
};

struct SelfConditioningWeights {
  Weight pre_norm;                // [H]
  Weight gate_proj, up_proj;      // [I, H]
  Weight down_proj;               // [H, I]
  bool present() const { return !pre_norm.empty(); }
};

struct ModelWeights {
  Weight embed_tokens;  // [V, H]; also the tied LM head
  Weight final_norm;    // [H]
  std::vector<LayerWeights> layers;
  SelfConditioningWeights self_conditioning;  // DiffusionGemma only
};

// Which tensor a ParamSpec describes, for code that treats tensors differently (fusing, dtype).
enum class Param {
  kEmbedTokens, kFinalNorm,
  kQProj, kKProj, kVProj, kOProj, kQNorm, kKNorm,
  kInputLayernorm, kPostAttentionLayernorm, kPreFeedforwardLayernorm, kPostFeedforwardLayernorm,
  kMlpGate, kMlpUp, kMlpDown, kLayerScalar,
  kPostFeedforwardLayernorm1, kPreFeedforwardLayernorm2, kPostFeedforwardLayernorm2,
  kRouterProj, kRouterScale, kRouterPerExpertScale, kExpertsGateUp, kExpertsDown,
  kScPreNorm, kScGate, kScUp, kScDown,
  kSentinel
};

struct ParamSpec {
  Param param = Param::kSentinel;
  int layer = -1;    // -1 for tensors outside the layers
  std::string name;  // under the backbone prefix, e.g. "layers.3.self_attn.q_proj.weight"
  Shape shape;       // what the config implies
  bool is_matrix() const { return shape.rank >= 2; }
};

// Calls f(const ParamSpec&, W&) for every tensor the config implies, W = Weight or const Weight.
template <class Weights, class F>
void for_each_parameter(const ModelConfig& cfg, Weights& w, F&& f) {
  const std::int64_t H = cfg.hidden_size, V = cfg.vocab_size, I = cfg.intermediate_size, Hq = cfg.num_heads;
  const auto visit = [&](Param p, int layer, std::string name, Shape shape, auto& weight) {
    f(ParamSpec{p, layer, std::move(name), shape}, weight);
  };
  visit(Param::kEmbedTokens, -1, "embed_tokens.weight", {V, H}, w.embed_tokens);
  visit(Param::kFinalNorm, -1, "norm.weight", {H}, w.final_norm);
  for (int l = 0; l < cfg.num_layers() && l < static_cast<int>(w.layers.size()); ++l) {
    const LayerSpec& s = cfg.layers[static_cast<std::size_t>(l)];
    auto& L = w.layers[static_cast<std::size_t>(l)];
    const std::string p = "layers." + std::to_string(l) + ".";
    const std::int64_t D = s.head_dim, Hkv = s.num_kv_heads;
    visit(Param::kQProj, l, p + "self_attn.q_proj.weight", {Hq * D, H}, L.q_proj);
    visit(Param::kKProj, l, p + "self_attn.k_proj.weight", {Hkv * D, H}, L.k_proj);
    if (s.has_v_proj) visit(Param::kVProj, l, p + "self_attn.v_proj.weight", {Hkv * D, H}, L.v_proj);
    visit(Param::kOProj, l, p + "self_attn.o_proj.weight", {H, Hq * D}, L.o_proj);
    visit(Param::kQNorm, l, p + "self_attn.q_norm.weight", {D}, L.q_norm);
    visit(Param::kKNorm, l, p + "self_attn.k_norm.weight", {D}, L.k_norm);
    visit(Param::kInputLayernorm, l, p + "input_layernorm.weight", {H}, L.input_layernorm);
    visit(Param::kPostAttentionLayernorm, l, p + "post_attention_layernorm.weight", {H}, L.post_attention_layernorm);
    visit(Param::kPreFeedforwardLayernorm, l, p + "pre_feedforward_layernorm.weight", {H}, L.pre_feedforward_layernorm);
    visit(Param::kPostFeedforwardLayernorm, l, p + "post_feedforward_layernorm.weight", {H},
          L.post_feedforward_layernorm);
    visit(Param::kMlpGate, l, p + "mlp.gate_proj.weight", {I, H}, L.mlp_gate);
    visit(Param::kMlpUp, l, p + "mlp.up_proj.weight", {I, H}, L.mlp_up);
    visit(Param::kMlpDown, l, p + "mlp.down_proj.weight", {H, I}, L.mlp_down);
    visit(Param::kLayerScalar, l, p + "layer_scalar", {1}, L.layer_scalar);
    if (cfg.enable_moe_block) {
      const std::int64_t E = cfg.num_experts, Im = cfg.moe_intermediate_size;
      visit(Param::kPostFeedforwardLayernorm1, l, p + "post_feedforward_layernorm_1.weight", {H},
            L.post_feedforward_layernorm_1);
      visit(Param::kPreFeedforwardLayernorm2, l, p + "pre_feedforward_layernorm_2.weight", {H},
            L.pre_feedforward_layernorm_2);
      visit(Param::kPostFeedforwardLayernorm2, l, p + "post_feedforward_layernorm_2.weight", {H},
            L.post_feedforward_layernorm_2);
      visit(Param::kRouterProj, l, p + "router.proj.weight", {E, H}, L.router_proj);
      visit(Param::kRouterScale, l, p + "router.scale", {H}, L.router_scale);
      visit(Param::kRouterPerExpertScale, l, p + "router.per_expert_scale", {E}, L.router_per_expert_scale);
      visit(Param::kExpertsGateUp, l, p + "experts.gate_up_proj", {E, 2 * Im, H}, L.experts_gate_up);
      visit(Param::kExpertsDown, l, p + "experts.down_proj", {E, H, Im}, L.experts_down);
    }
  }
  if (cfg.is_diffusion()) {
    auto& sc = w.self_conditioning;
    visit(Param::kScPreNorm, -1, "self_conditioning.pre_norm.weight", {H}, sc.pre_norm);
    visit(Param::kScGate, -1, "self_conditioning.gate_proj.weight", {I, H}, sc.gate_proj);
    visit(Param::kScUp, -1, "self_conditioning.up_proj.weight", {I, H}, sc.up_proj);
    visit(Param::kScDown, -1, "self_conditioning.down_proj.weight", {H, I}, sc.down_proj);
  }
}

// Parameters and their bytes in dtype `dtype`, from the config alone (no weights needed).
inline std::int64_t parameter_count(const ModelConfig& cfg) {
  ModelWeights shapes;
  shapes.layers.resize(cfg.layers.size());
  std::int64_t n = 0;
  for_each_parameter(cfg, shapes, [&](const ParamSpec& p, Weight&) { n += p.shape.numel(); });
  return n;
}

// The dtype transformers makes the model in, as from_pretrained's default dtype="auto" picks it:
// config.json's `dtype` (or `torch_dtype`) when it states one, else the stored embedding's.
inline DType model_dtype(const ModelConfig& config, const ModelWeights& weights) {
  return config.dtype != DType::kSentinel ? config.dtype : weights.embed_tokens.dtype;
}

// The embedding scale sqrt(hidden), rounded to the model's dtype as transformers multiplies it
// (53.0 for the real BF16 checkpoint, 53.066 for an F32 one; docs/model.md §2).
inline float embedding_scale(int hidden_size, DType embedding_dtype) {
  const float root = std::sqrt(static_cast<float>(hidden_size));
  switch (embedding_dtype) {
    case DType::kBF16: return round_to_bfloat16(root);
    case DType::kF16: return float16::from_float(root).to_float();
    default: return root;
  }
}

}  // namespace diffusion_gemma
