// SPDX-License-Identifier: Apache-2.0
// Binder: takes tensors out of a checkpoint by name, checking presence, shape and dtype, and
// reports every missing, misshapen and unexpected tensor at once, by name. BindReport is what a
// binding found (prefix, quantization, tensors ignored).
#pragma once

#include <algorithm>
#include <cstdint>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include <diffusion_gemma/core/status.hpp>
#include <diffusion_gemma/io/safetensors.hpp>

namespace diffusion_gemma::io {

struct BindReport {
  std::string prefix;                 // e.g. "model.decoder."
  std::size_t ignored_vision = 0;     // vision/audio tower tensors, not used by the text backbone
  std::size_t ignored_activation_scales = 0;  // input_scale of W8A8 static schemes: weight-only compute
  std::size_t bound = 0;
  std::string quantization = "none";  // QuantizationConfig::describe()
  std::map<std::string, std::size_t> quantized;  // scheme in words -> matrices stored so
  bool split_experts = false;         // experts stored one matrix each
  std::string summary() const {
    std::ostringstream s;
    s << "bound " << bound << " tensors under '" << prefix << "'";
    if (ignored_vision) s << "; ignored " << ignored_vision << " vision-tower tensors (text-only backbone)";
    if (ignored_activation_scales) s << "; ignored " << ignored_activation_scales << " activation scales (weights-only compute)";
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
  // The entry named `name` if the checkpoint has it (marked as used), else nullptr.
  const SafetensorsEntry* use(const std::string& name) {
    const SafetensorsEntry* e = ckpt_.find(name);
    if (e != nullptr) used_.push_back(name);
    return e;
  }
  bool has(const std::string& name) const { return ckpt_.contains(name); }
  void problem(std::string what) { problems_.push_back(std::move(what)); }
  void missing(std::string what) { missing_.push_back(std::move(what)); }
  const Checkpoint& checkpoint() const { return ckpt_; }

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

}  // namespace detail

}  // namespace diffusion_gemma::io
