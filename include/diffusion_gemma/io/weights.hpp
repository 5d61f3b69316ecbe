// SPDX-License-Identifier: Apache-2.0
// Binds a checkpoint's tensor names to ModelWeights, checking every expected tensor's presence,
// shape and dtype, and reporting missing, misshapen and unexpected tensors by name, all at once.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <sstream>
#include <string>
#include <vector>

#include <diffusion_gemma/core/status.hpp>
#include <diffusion_gemma/io/safetensors.hpp>
#include <diffusion_gemma/model/config.hpp>
#include <diffusion_gemma/model/weights.hpp>

namespace diffusion_gemma::io {

struct BindReport {
  std::string prefix;                 // e.g. "model.decoder."
  std::size_t ignored_vision = 0;     // vision/audio tower tensors, not used by the text backbone
  std::size_t bound = 0;
  std::string summary() const {
    std::ostringstream s;
    s << "bound " << bound << " tensors under '" << prefix << "'";
    if (ignored_vision) s << "; ignored " << ignored_vision << " vision-tower tensors (text-only backbone)";
    return s.str();
  }
};

namespace detail {

inline bool starts_with(const std::string& s, const std::string& p) { return s.compare(0, p.size(), p) == 0; }

inline bool is_vision_tensor(const std::string& n) {
  for (const char* p : {"model.encoder.vision_tower.", "model.encoder.embed_vision.", "model.vision_tower.",
                        "model.embed_vision.", "model.audio_tower.", "model.embed_audio."}) {
    if (starts_with(n, p)) return true;
  }
  return false;
}

class Binder {
 public:
  Binder(const Checkpoint& ckpt) : ckpt_(ckpt) {}

  RawTensor take(const std::string& name, const Shape& shape) {
    used_.push_back(name);
    const SafetensorsEntry* e = ckpt_.find(name);
    if (e == nullptr) {
      missing_.push_back(name + " " + shape.str());
      return {};
    }
    const DType t = e->tensor.dtype;
    if (t != DType::kF32 && t != DType::kF16 && t != DType::kBF16) {
      problems_.push_back(name + ": dtype " + dtype_name(t) + ", expected F32, F16 or BF16 (" + ckpt_.file_of(name) + ")");
      return {};
    }
    if (e->tensor.shape != shape) {
      problems_.push_back(name + ": shape " + e->tensor.shape.str() + ", expected " + shape.str() + " (" +
                          ckpt_.file_of(name) + ")");
      return {};
    }
    return e->tensor;
  }
  void allow(const std::string& name) { used_.push_back(name); }

  void finish(BindReport* report) {
    std::vector<std::string> unexpected;
    std::sort(used_.begin(), used_.end());
    for (const auto& n : ckpt_.names()) {
      if (std::binary_search(used_.begin(), used_.end(), n)) continue;
      if (is_vision_tensor(n)) {
        if (report) ++report->ignored_vision;
        continue;
      }
      unexpected.push_back(n);
    }
    if (missing_.empty() && problems_.empty() && unexpected.empty()) {
      if (report) report->bound = used_.size();
      return;
    }
    std::ostringstream msg;
    msg << ckpt_.dir() << ": checkpoint does not match its config.json";
    const auto list = [&](const char* title, const std::vector<std::string>& v) {
      if (v.empty()) return;
      msg << "\n  " << title << " (" << v.size() << "):";
      for (std::size_t i = 0; i < v.size() && i < 20; ++i) msg << "\n    " << v[i];
      if (v.size() > 20) msg << "\n    ... and " << v.size() - 20 << " more";
    };
    list("missing tensors", missing_);
    list("wrong shape or dtype", problems_);
    list("unexpected tensors", unexpected);
    throw_error(StatusCode::kFormatError, msg.str());
  }

 private:
  const Checkpoint& ckpt_;
  std::vector<std::string> used_, missing_, problems_;
};

inline float scalar_value(const RawTensor& t) { return t.empty() ? 0.0f : load_as_float(t, 0); }

}  // namespace detail

// Chooses where the text backbone lives inside the checkpoint.
inline std::string backbone_prefix(const Checkpoint& ckpt, const ModelConfig& cfg) {
  if (cfg.is_diffusion()) return "model.decoder.";
  for (const char* p : {"model.language_model.", "model."}) {
    if (ckpt.contains(std::string(p) + "embed_tokens.weight")) return p;
  }
  throw_error(StatusCode::kNotFound, ckpt.dir(),
              ": no embed_tokens.weight under 'model.language_model.' or 'model.' (is this a Gemma 4 checkpoint?)");
}

inline ModelWeights bind_weights(const Checkpoint& ckpt, const ModelConfig& cfg, BindReport* report = nullptr) {
  detail::Binder b(ckpt);
  const std::string pre = backbone_prefix(ckpt, cfg);
  if (report) report->prefix = pre;
  const std::int64_t H = cfg.hidden_size, V = cfg.vocab_size, I = cfg.intermediate_size;
  ModelWeights w;
  w.embed_tokens = b.take(pre + "embed_tokens.weight", {V, H});
  w.final_norm = b.take(pre + "norm.weight", {H});
  // A stored LM head is the tied embedding written twice; accept it, never read it.
  b.allow("lm_head.weight");
  w.layers.resize(cfg.layers.size());
  for (int l = 0; l < cfg.num_layers(); ++l) {
    const LayerSpec& s = cfg.layers[l];
    LayerWeights& L = w.layers[l];
    const std::string p = pre + "layers." + std::to_string(l) + ".";
    const std::int64_t D = s.head_dim, Hq = cfg.num_heads, Hkv = s.num_kv_heads;
    L.q_proj = b.take(p + "self_attn.q_proj.weight", {Hq * D, H});
    L.k_proj = b.take(p + "self_attn.k_proj.weight", {Hkv * D, H});
    if (s.has_v_proj) L.v_proj = b.take(p + "self_attn.v_proj.weight", {Hkv * D, H});
    L.o_proj = b.take(p + "self_attn.o_proj.weight", {H, Hq * D});
    L.q_norm = b.take(p + "self_attn.q_norm.weight", {D});
    L.k_norm = b.take(p + "self_attn.k_norm.weight", {D});
    L.input_layernorm = b.take(p + "input_layernorm.weight", {H});
    L.post_attention_layernorm = b.take(p + "post_attention_layernorm.weight", {H});
    L.pre_feedforward_layernorm = b.take(p + "pre_feedforward_layernorm.weight", {H});
    L.post_feedforward_layernorm = b.take(p + "post_feedforward_layernorm.weight", {H});
    L.mlp_gate = b.take(p + "mlp.gate_proj.weight", {I, H});
    L.mlp_up = b.take(p + "mlp.up_proj.weight", {I, H});
    L.mlp_down = b.take(p + "mlp.down_proj.weight", {H, I});
    L.layer_scalar = b.take(p + "layer_scalar", {1});
    if (cfg.enable_moe_block) {
      const std::int64_t E = cfg.num_experts, Im = cfg.moe_intermediate_size;
      L.post_feedforward_layernorm_1 = b.take(p + "post_feedforward_layernorm_1.weight", {H});
      L.pre_feedforward_layernorm_2 = b.take(p + "pre_feedforward_layernorm_2.weight", {H});
      L.post_feedforward_layernorm_2 = b.take(p + "post_feedforward_layernorm_2.weight", {H});
      L.router_proj = b.take(p + "router.proj.weight", {E, H});
      L.router_scale = b.take(p + "router.scale", {H});
      L.router_per_expert_scale = b.take(p + "router.per_expert_scale", {E});
      L.experts_gate_up = b.take(p + "experts.gate_up_proj", {E, 2 * Im, H});
      L.experts_down = b.take(p + "experts.down_proj", {E, H, Im});
    }
  }
  std::vector<std::pair<std::string, RawTensor>> encoder_scalars;
  if (cfg.is_diffusion()) {
    const std::string sc = pre + "self_conditioning.";
    w.self_conditioning.pre_norm = b.take(sc + "pre_norm.weight", {H});
    w.self_conditioning.gate_proj = b.take(sc + "gate_proj.weight", {I, H});
    w.self_conditioning.up_proj = b.take(sc + "up_proj.weight", {I, H});
    w.self_conditioning.down_proj = b.take(sc + "down_proj.weight", {H, I});
    // The encoder shares every parameter with the decoder but transformers does not tie buffers,
    // so layer_scalar is stored twice. Both copies must agree: we run one backbone.
    for (int l = 0; l < cfg.num_layers(); ++l) {
      const std::string n = "model.encoder.language_model.layers." + std::to_string(l) + ".layer_scalar";
      encoder_scalars.emplace_back(n, b.take(n, {1}));
    }
  }
  b.finish(report);
  for (int l = 0; l < static_cast<int>(encoder_scalars.size()); ++l) {
    const float enc = detail::scalar_value(encoder_scalars[l].second);
    const float dec = detail::scalar_value(w.layers[l].layer_scalar);
    if (!(enc == dec)) {
      throw_error(StatusCode::kUnsupported, ckpt.dir(), ": ", encoder_scalars[l].first, " = ", enc, " differs from ", pre,
                  "layers.", l, ".layer_scalar = ", dec,
                  "; separate encoder and decoder layer scalars are not supported");
    }
  }
  return w;
}

// Scans every floating-point weight for NaN or Inf (opt-in: it reads the whole checkpoint).
inline void check_weights_finite(const Checkpoint& ckpt) {
  for (const auto& name : ckpt.names()) {
    const SafetensorsEntry* e = ckpt.find(name);
    const RawTensor& t = e->tensor;
    if (t.dtype != DType::kF32 && t.dtype != DType::kF16 && t.dtype != DType::kBF16) continue;
    const std::int64_t n = t.shape.numel();
    for (std::int64_t i = 0; i < n; ++i) {
      const float v = load_as_float(t, i);
      if (!std::isfinite(v)) {
        throw_error(StatusCode::kFormatError, ckpt.file_of(name), ": tensor '", name, "' has a non-finite value (", v,
                    ") at flat index ", i);
      }
    }
  }
}

}  // namespace diffusion_gemma::io
