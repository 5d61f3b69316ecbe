// SPDX-License-Identifier: Apache-2.0
// Binds a checkpoint's tensor names to ModelWeights (the list is model/weights.hpp's
// for_each_parameter), checking every expected tensor's presence, shape and dtype, and reporting
// missing, misshapen and unexpected tensors by name, all at once. The views borrow the memory maps.
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
  ModelWeights w;
  w.layers.resize(cfg.layers.size());
  for_each_parameter(cfg, w, [&](const ParamSpec& p, Weight& dst) { dst = Weight::borrow(b.take(pre + p.name, p.shape)); });
  // A stored LM head is the tied embedding written twice; accept it, never read it.
  b.allow("lm_head.weight");
  std::vector<std::pair<std::string, RawTensor>> encoder_scalars;
  if (cfg.is_diffusion()) {
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
    const float dec = detail::scalar_value(w.layers[l].layer_scalar.raw());
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
