// SPDX-License-Identifier: Apache-2.0
// Binds a checkpoint's tensor names to ModelWeights (the list is model/weights.hpp's
// for_each_parameter), checking every expected tensor's presence, shape and dtype, and reporting
// missing, misshapen and unexpected tensors by name, all at once. The views borrow the memory maps.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include <diffusion_gemma/core/status.hpp>
#include <diffusion_gemma/io/binder.hpp>
#include <diffusion_gemma/io/quantization_config.hpp>
#include <diffusion_gemma/io/quantized_weights.hpp>
#include <diffusion_gemma/io/safetensors.hpp>
#include <diffusion_gemma/model/config.hpp>
#include <diffusion_gemma/model/weights.hpp>

namespace diffusion_gemma::io {

namespace detail {

inline float scalar_value(const RawTensor& t) { return t.empty() ? 0.0f : load_as_float(t, 0); }

}  // namespace detail

// Chooses where the text backbone lives inside the checkpoint. DiffusionGemma's text weights are
// stored under the decoder or, in some quantized releases, under the encoder's language model
// (the two share every parameter).
inline std::string backbone_prefix(const Checkpoint& ckpt, const ModelConfig& cfg) {
  const std::vector<const char*> candidates = cfg.is_diffusion()
                                                  ? std::vector<const char*>{"model.decoder.", "model.encoder.language_model."}
                                                  : std::vector<const char*>{"model.language_model.", "model."};
  for (const char* p : candidates) {
    if (ckpt.contains(std::string(p) + "embed_tokens.weight")) return p;
  }
  // Without an embedding anywhere, binding under the decoder reports everything that is missing.
  if (cfg.is_diffusion()) return candidates[0];
  throw_error(StatusCode::kNotFound, ckpt.dir(), ": no embed_tokens.weight under '", candidates[0], "' or '",
              candidates[1], "' (is this a ", cfg.is_diffusion() ? "DiffusionGemma" : "Gemma 4", " checkpoint?)");
}

inline ModelWeights bind_weights(const Checkpoint& ckpt, const ModelConfig& cfg, const QuantizationConfig& quant,
                                 BindReport* report = nullptr) {
  detail::Binder b(ckpt);
  detail::MatrixBinder matrices(b, quant, report);
  const std::string pre = backbone_prefix(ckpt, cfg);
  if (report) {
    report->prefix = pre;
    report->quantization = quant.describe();
  }
  ModelWeights w;
  w.layers.resize(cfg.layers.size());
  const std::int64_t E = cfg.num_experts, Im = cfg.moe_intermediate_size, H = cfg.hidden_size;
  for_each_parameter(cfg, w, [&](const ParamSpec& p, Weight& dst) {
    const std::string name = pre + p.name;
    if (p.param == Param::kEmbedTokens) {
      dst = matrices.plain(name, p.shape);
    } else if (p.param == Param::kExpertsGateUp || p.param == Param::kExpertsDown) {
      const std::string experts = pre + "layers." + std::to_string(p.layer) + ".experts.";
      dst = p.param == Param::kExpertsGateUp ? matrices.experts(name, experts, {"gate_proj", "up_proj"}, E, Im, H)
                                             : matrices.experts(name, experts, {"down_proj"}, E, H, Im);
    } else if (p.is_matrix()) {
      dst = matrices.linear(name.substr(0, name.size() - 7), p.shape[0], p.shape[1]);  // drop ".weight"
    } else {
      dst = Weight::borrow(b.take(name, p.shape));
    }
  });
  // A stored LM head is the tied embedding written twice; accept it, never read it.
  b.allow("lm_head.weight");
  std::vector<std::pair<std::string, RawTensor>> other_scalars;
  if (cfg.is_diffusion()) {
    // The encoder shares every parameter with the decoder but transformers does not tie buffers,
    // so layer_scalar is stored twice. Both copies must agree: we run one backbone. The encoder's
    // copy is required when the weights sit under the decoder; the decoder's is optional.
    const bool under_decoder = pre == "model.decoder.";
    for (int l = 0; l < cfg.num_layers(); ++l) {
      const std::string n = std::string(under_decoder ? "model.encoder.language_model." : "model.decoder.") + "layers." +
                            std::to_string(l) + ".layer_scalar";
      if (under_decoder || b.has(n)) other_scalars.emplace_back(n, b.take(n, {1}));
    }
  }
  b.finish(report);
  for (const auto& [name, tensor] : other_scalars) {
    const int l = std::stoi(name.substr(name.find("layers.") + 7));
    const float other = detail::scalar_value(tensor);
    const float used = detail::scalar_value(w.layers[static_cast<std::size_t>(l)].layer_scalar.raw());
    if (!(other == used)) {
      throw_error(StatusCode::kUnsupported, ckpt.dir(), ": ", name, " = ", other, " differs from ", pre, "layers.", l,
                  ".layer_scalar = ", used, "; separate encoder and decoder layer scalars are not supported");
    }
  }
  return w;
}

// Binds a checkpoint that is not quantized.
inline ModelWeights bind_weights(const Checkpoint& ckpt, const ModelConfig& cfg, BindReport* report = nullptr) {
  return bind_weights(ckpt, cfg, QuantizationConfig{}, report);
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
