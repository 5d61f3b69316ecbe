// SPDX-License-Identifier: Apache-2.0
// cpu::Model: a loaded checkpoint as fp32 parameters, immutable after load and safe to share
// between threads (each thread runs its own cpu::Engine over it). F32 checkpoints are used in
// place from the memory map; BF16/F16 weights are widened once at load (4 bytes per parameter).
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>


#include <diffusion_gemma/core/bfloat16.hpp>
#include <diffusion_gemma/core/float16.hpp>
#include <diffusion_gemma/core/status.hpp>
#include <diffusion_gemma/core/tensor_view.hpp>
#include <diffusion_gemma/cpu/amx.hpp>
#include <diffusion_gemma/io/config.hpp>
#include <diffusion_gemma/io/safetensors.hpp>
#include <diffusion_gemma/io/weights.hpp>
#include <diffusion_gemma/model/config.hpp>
#include <diffusion_gemma/model/weights.hpp>

namespace diffusion_gemma::cpu {

// An fp32 tensor that either borrows a suitably aligned F32 checkpoint tensor or owns a widened copy.
class FloatTensor {
 public:
  FloatTensor() = default;
  explicit FloatTensor(const RawTensor& t) : shape_(t.shape) {
    if (t.empty()) return;
    const bool aligned = reinterpret_cast<std::uintptr_t>(t.data) % alignof(float) == 0;
    if (t.dtype == DType::kF32 && aligned) {
      data_ = reinterpret_cast<const float*>(t.data);
      return;
    }
    const std::int64_t n = t.shape.numel();
    owned_.resize(static_cast<std::size_t>(n));
    for (std::int64_t i = 0; i < n; ++i) owned_[i] = load_as_float(t, i);
    data_ = owned_.data();
  }
  FloatTensor(const FloatTensor&) = delete;
  FloatTensor& operator=(const FloatTensor&) = delete;
  FloatTensor(FloatTensor&& o) noexcept { *this = std::move(o); }
  FloatTensor& operator=(FloatTensor&& o) noexcept {
    const bool self_owned = o.data_ != nullptr && o.data_ == o.owned_.data();
    owned_ = std::move(o.owned_);
    data_ = self_owned ? owned_.data() : o.data_;
    shape_ = o.shape_;
    o.data_ = nullptr;
    return *this;
  }

  const float* data() const { return data_; }
  const Shape& shape() const { return shape_; }
  bool empty() const { return data_ == nullptr; }
  std::size_t owned_bytes() const { return owned_.size() * sizeof(float); }

 private:
  std::vector<float> owned_;
  const float* data_ = nullptr;
  Shape shape_;
};

struct LayerParams {
  FloatTensor q_proj, k_proj, v_proj, o_proj, q_norm, k_norm;
  FloatTensor input_layernorm, post_attention_layernorm, pre_feedforward_layernorm, post_feedforward_layernorm;
  FloatTensor post_feedforward_layernorm_1, pre_feedforward_layernorm_2, post_feedforward_layernorm_2;
  FloatTensor mlp_gate, mlp_up, mlp_down;
  FloatTensor router_proj, router_scale, router_per_expert_scale, experts_gate_up, experts_down;
  float layer_scalar = 1.0f;
};

// Progress of a long load: (tensors done, tensors total).
using LoadProgress = std::function<void(std::size_t, std::size_t)>;

class Model {
 public:
  // Loads config.json, generation_config.json and the weights of a checkpoint directory.
  static std::shared_ptr<const Model> load(const std::string& dir, const LoadProgress& progress = {},
                                           bool check_finite = false) {
    auto m = std::shared_ptr<Model>(new Model());
    m->dir_ = dir;
    m->config_ = io::load_model_config(dir);
    m->generation_ = io::load_generation_config(dir);
    m->checkpoint_ = std::make_unique<io::Checkpoint>(dir);
    if (check_finite) io::check_weights_finite(*m->checkpoint_);
    const ModelWeights w = io::bind_weights(*m->checkpoint_, m->config_, &m->report_);
    m->convert(w, progress);
    return m;
  }

  const ModelConfig& config() const { return config_; }
  const GenerationConfig& generation_config() const { return generation_; }
  const std::string& dir() const { return dir_; }
  const io::BindReport& bind_report() const { return report_; }

  const FloatTensor& embed_tokens() const { return embed_; }
  const FloatTensor& final_norm() const { return final_norm_; }
  const LayerParams& layer(int l) const { return layers_[l]; }
  const FloatTensor& sc_pre_norm() const { return sc_pre_norm_; }
  const FloatTensor& sc_gate() const { return sc_gate_; }
  const FloatTensor& sc_up() const { return sc_up_; }
  const FloatTensor& sc_down() const { return sc_down_; }
  bool has_self_conditioning() const { return !sc_pre_norm_.empty(); }
  // sqrt(hidden) rounded to the embedding weights' dtype, as transformers multiplies it (53.0 for
  // the real BF16 checkpoint, 53.066 for an F32 one).
  float embed_scale() const { return embed_scale_; }
  // The embedding table packed for the AMX vocabulary pass, built on first use (thread-safe). It
  // costs 2 x V x H x 2 bytes on top of the fp32 table, which embedding lookups and the fp32 paths
  // keep using. (Releasing the fp32 pages does not help: lookups fault whole large folios back in.)
  const amx::PackedEmbedding& packed_embedding() const {
    std::call_once(packed_once_, [&] {
      packed_ = amx::PackedEmbedding::pack(embed_.data(), config_.vocab_size, config_.hidden_size);
    });
    return packed_;
  }
  DType weight_dtype() const { return weight_dtype_; }
  std::size_t owned_bytes() const { return owned_bytes_; }
  // Bytes of all parameters as fp32 (whether widened copies or mapped from an F32 checkpoint).
  std::size_t parameter_bytes() const { return parameter_bytes_; }

 private:
  Model() = default;

  void convert(const ModelWeights& w, const LoadProgress& progress) {
    std::size_t total = 2 + w.layers.size() + (w.self_conditioning.present() ? 1 : 0), done = 0;
    const auto tick = [&] {
      ++done;
      if (progress) progress(done, total);
    };
    weight_dtype_ = w.embed_tokens.dtype;
    const float root = std::sqrt(static_cast<float>(config_.hidden_size));
    embed_scale_ = weight_dtype_ == DType::kBF16  ? round_to_bfloat16(root)
                   : weight_dtype_ == DType::kF16 ? float16::from_float(root).to_float()
                                                  : root;
    embed_ = FloatTensor(w.embed_tokens);
    tick();
    final_norm_ = FloatTensor(w.final_norm);
    tick();
    layers_.resize(w.layers.size());
    for (std::size_t l = 0; l < w.layers.size(); ++l) {
      const LayerWeights& s = w.layers[l];
      LayerParams& d = layers_[l];
      d.q_proj = FloatTensor(s.q_proj);
      d.k_proj = FloatTensor(s.k_proj);
      d.v_proj = FloatTensor(s.v_proj);
      d.o_proj = FloatTensor(s.o_proj);
      d.q_norm = FloatTensor(s.q_norm);
      d.k_norm = FloatTensor(s.k_norm);
      d.input_layernorm = FloatTensor(s.input_layernorm);
      d.post_attention_layernorm = FloatTensor(s.post_attention_layernorm);
      d.pre_feedforward_layernorm = FloatTensor(s.pre_feedforward_layernorm);
      d.post_feedforward_layernorm = FloatTensor(s.post_feedforward_layernorm);
      d.post_feedforward_layernorm_1 = FloatTensor(s.post_feedforward_layernorm_1);
      d.pre_feedforward_layernorm_2 = FloatTensor(s.pre_feedforward_layernorm_2);
      d.post_feedforward_layernorm_2 = FloatTensor(s.post_feedforward_layernorm_2);
      d.mlp_gate = FloatTensor(s.mlp_gate);
      d.mlp_up = FloatTensor(s.mlp_up);
      d.mlp_down = FloatTensor(s.mlp_down);
      d.router_proj = FloatTensor(s.router_proj);
      d.router_scale = FloatTensor(s.router_scale);
      d.router_per_expert_scale = FloatTensor(s.router_per_expert_scale);
      d.experts_gate_up = FloatTensor(s.experts_gate_up);
      d.experts_down = FloatTensor(s.experts_down);
      d.layer_scalar = load_as_float(s.layer_scalar, 0);
      tick();
    }
    if (w.self_conditioning.present()) {
      sc_pre_norm_ = FloatTensor(w.self_conditioning.pre_norm);
      sc_gate_ = FloatTensor(w.self_conditioning.gate_proj);
      sc_up_ = FloatTensor(w.self_conditioning.up_proj);
      sc_down_ = FloatTensor(w.self_conditioning.down_proj);
      tick();
    }
    const auto bytes = [](const FloatTensor& t) { return t.empty() ? std::size_t{0} : static_cast<std::size_t>(t.shape().numel()) * 4; };
    parameter_bytes_ = bytes(embed_) + bytes(final_norm_) + bytes(sc_pre_norm_) + bytes(sc_gate_) + bytes(sc_up_) + bytes(sc_down_);
    for (const auto& L : layers_) {
      for (const FloatTensor* t : {&L.q_proj, &L.k_proj, &L.v_proj, &L.o_proj, &L.q_norm, &L.k_norm, &L.input_layernorm,
                                   &L.post_attention_layernorm, &L.pre_feedforward_layernorm, &L.post_feedforward_layernorm,
                                   &L.post_feedforward_layernorm_1, &L.pre_feedforward_layernorm_2,
                                   &L.post_feedforward_layernorm_2, &L.mlp_gate, &L.mlp_up, &L.mlp_down, &L.router_proj,
                                   &L.router_scale, &L.router_per_expert_scale, &L.experts_gate_up, &L.experts_down}) {
        parameter_bytes_ += bytes(*t);
      }
    }
    owned_bytes_ = embed_.owned_bytes();
    for (const auto& L : layers_) {
      for (const FloatTensor* t : {&L.q_proj, &L.k_proj, &L.v_proj, &L.o_proj, &L.mlp_gate, &L.mlp_up, &L.mlp_down,
                                   &L.router_proj, &L.experts_gate_up, &L.experts_down}) {
        owned_bytes_ += t->owned_bytes();
      }
    }
  }

  std::string dir_;
  ModelConfig config_;
  GenerationConfig generation_;
  std::unique_ptr<io::Checkpoint> checkpoint_;
  io::BindReport report_;
  FloatTensor embed_, final_norm_;
  std::vector<LayerParams> layers_;
  FloatTensor sc_pre_norm_, sc_gate_, sc_up_, sc_down_;
  float embed_scale_ = 1.0f;
  DType weight_dtype_ = DType::kF32;
  std::size_t owned_bytes_ = 0;
  std::size_t parameter_bytes_ = 0;
  mutable std::once_flag packed_once_;
  mutable amx::PackedEmbedding packed_;
};

}  // namespace diffusion_gemma::cpu
