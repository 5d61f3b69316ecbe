// SPDX-License-Identifier: Apache-2.0
// cuda::Model: a backbone's parameters in device memory, immutable after construction and
// shareable between engines on the same device. Matrices and the embedding table are stored in
// BF16 (default) or F32 (the exactness mode that the parity tests use); norm weights, router
// scales and layer scalars stay F32 (they are widened once, as transformers' fp32 norm math does).
// Projections that read the same input are fused at upload: q|k|v rows, dense gate|up and the
// self-conditioning gate|up, so each is one GEMM.
//
// Built from host views of the weights (model/weights.hpp): a checkpoint bound with
// io::bind_weights, or a loaded cpu::Model's fp32 tensors; cuda/ never includes io/ or cpu/, the
// caller does the loading. Host code only: compiles without nvcc.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <diffusion_gemma/core/bfloat16.hpp>
#include <diffusion_gemma/core/dtype.hpp>
#include <diffusion_gemma/core/float16.hpp>
#include <diffusion_gemma/core/status.hpp>
#include <diffusion_gemma/core/tensor_view.hpp>
#include <diffusion_gemma/cuda/runtime.hpp>
#include <diffusion_gemma/model/config.hpp>
#include <diffusion_gemma/model/weights.hpp>

namespace diffusion_gemma::cuda {

struct ModelOptions {
  DType dtype = DType::kBF16;  // storage of matrices and embeddings: kBF16 or kF32
  float embed_scale = 0.0f;    // 0: sqrt(hidden) rounded to the embedding weights' dtype, as cpu::Model
};

// A parameter inside the model's device arena.
struct TensorRef {
  std::size_t offset = 0;  // bytes from the arena's start
  std::int64_t count = 0;  // elements
  DType dtype = DType::kF32;
  bool empty() const { return count == 0; }
  std::size_t bytes() const { return static_cast<std::size_t>(count) * dtype_size(dtype); }
};

struct DeviceLayer {
  // Storage dtype, [out, in] like torch Linear weights.
  TensorRef qkv;              // [(Hq + Hkv * (has_v ? 2 : 1)) * D, H]
  TensorRef o_proj;           // [H, Hq * D]
  TensorRef mlp_gate_up;      // [2 I, H]: gate rows, then up rows
  TensorRef mlp_down;         // [H, I]
  TensorRef router_proj;      // [E, H]
  TensorRef experts_gate_up;  // [E, 2 Im, H]
  TensorRef experts_down;     // [E, H, Im]
  // F32 vectors.
  TensorRef q_norm, k_norm;   // [D]
  TensorRef input_layernorm, post_attention_layernorm, pre_feedforward_layernorm, post_feedforward_layernorm;
  TensorRef post_feedforward_layernorm_1, pre_feedforward_layernorm_2, post_feedforward_layernorm_2;
  TensorRef router_scale;             // [H]
  TensorRef router_per_expert_scale;  // [E]
  float layer_scalar = 1.0f;
  std::int64_t qkv_rows = 0;
};

class Model {
 public:
  // Uploads `w` (any of F32, F16, BF16 on the host) in `opts.dtype`. Checks that the device has
  // room for every parameter before allocating, and names any tensor whose size is wrong.
  static std::shared_ptr<const Model> create(const ModelConfig& cfg, const ModelWeights& w, ModelOptions opts = {},
                                             GenerationConfig generation = {}) {
    auto m = std::shared_ptr<Model>(new Model(cfg, opts, std::move(generation)));
    const DType src = w.embed_tokens.empty() ? opts.dtype : w.embed_tokens.dtype;
    m->embed_scale_ = opts.embed_scale > 0.0f ? opts.embed_scale : default_embed_scale(cfg, src);
    m->upload(w);
    return m;
  }

  // Every parameter allocated, contents undefined: benchmarks fill them on the device with random
  // values (launch_fill_uniform) so that no checkpoint and no host copy are needed.
  static std::shared_ptr<Model> uninitialized(const ModelConfig& cfg, ModelOptions opts = {}) {
    auto m = std::shared_ptr<Model>(new Model(cfg, opts, GenerationConfig{}));
    m->embed_scale_ = opts.embed_scale > 0.0f ? opts.embed_scale : default_embed_scale(cfg, opts.dtype);
    return m;
  }

  // Bytes the parameters of `cfg` take on the device in storage dtype `dtype`.
  static std::size_t parameter_bytes(const ModelConfig& cfg, DType dtype) {
    Model m(cfg, dtype);
    return m.arena_bytes_;
  }

  const ModelConfig& config() const { return cfg_; }
  const GenerationConfig& generation_config() const { return generation_; }
  DType dtype() const { return dtype_; }
  float embed_scale() const { return embed_scale_; }
  std::size_t bytes() const { return arena_bytes_; }

  const TensorRef& embed_tokens() const { return embed_; }
  const TensorRef& final_norm() const { return final_norm_; }
  const TensorRef& sc_pre_norm() const { return sc_pre_norm_; }
  const TensorRef& sc_gate_up() const { return sc_gate_up_; }
  const TensorRef& sc_down() const { return sc_down_; }
  bool has_self_conditioning() const { return !sc_pre_norm_.empty(); }
  const DeviceLayer& layer(int l) const { return layers_[static_cast<std::size_t>(l)]; }

  template <class T = void>
  const T* ptr(const TensorRef& t) const {
    return t.empty() ? nullptr : reinterpret_cast<const T*>(arena_.data() + t.offset);
  }
  template <class T = void>
  T* mutable_ptr(const TensorRef& t) {
    return t.empty() ? nullptr : reinterpret_cast<T*>(arena_.data() + t.offset);
  }

  // Calls f(name, ref, is_vector) for every parameter (vectors: norms and scales, F32).
  template <class F>
  void for_each_parameter(F&& f) const {
    using Entry = std::pair<const char*, const TensorRef*>;
    f(std::string("embed_tokens"), embed_, false);
    f(std::string("norm"), final_norm_, true);
    for (std::size_t l = 0; l < layers_.size(); ++l) {
      const DeviceLayer& L = layers_[l];
      const std::string p = "layers." + std::to_string(l) + ".";
      const Entry matrices[] = {{"qkv", &L.qkv},
                                {"o_proj", &L.o_proj},
                                {"mlp.gate_up", &L.mlp_gate_up},
                                {"mlp.down", &L.mlp_down},
                                {"router.proj", &L.router_proj},
                                {"experts.gate_up", &L.experts_gate_up},
                                {"experts.down", &L.experts_down}};
      const Entry vectors[] = {{"q_norm", &L.q_norm},
                               {"k_norm", &L.k_norm},
                               {"input_layernorm", &L.input_layernorm},
                               {"post_attention_layernorm", &L.post_attention_layernorm},
                               {"pre_feedforward_layernorm", &L.pre_feedforward_layernorm},
                               {"post_feedforward_layernorm", &L.post_feedforward_layernorm},
                               {"post_feedforward_layernorm_1", &L.post_feedforward_layernorm_1},
                               {"pre_feedforward_layernorm_2", &L.pre_feedforward_layernorm_2},
                               {"post_feedforward_layernorm_2", &L.post_feedforward_layernorm_2},
                               {"router.scale", &L.router_scale},
                               {"router.per_expert_scale", &L.router_per_expert_scale}};
      for (const Entry& e : matrices) {
        if (!e.second->empty()) f(p + e.first, *e.second, false);
      }
      for (const Entry& e : vectors) {
        if (!e.second->empty()) f(p + e.first, *e.second, true);
      }
    }
    if (has_self_conditioning()) {
      f(std::string("self_conditioning.pre_norm"), sc_pre_norm_, true);
      f(std::string("self_conditioning.gate_up"), sc_gate_up_, false);
      f(std::string("self_conditioning.down"), sc_down_, false);
    }
  }

  static float default_embed_scale(const ModelConfig& cfg, DType weights) {
    const float root = std::sqrt(static_cast<float>(cfg.hidden_size));
    return weights == DType::kBF16 ? round_to_bfloat16(root)
           : weights == DType::kF16 ? float16::from_float(root).to_float()
                                    : root;
  }

 private:
  // Plans the arena (offsets of every parameter) without touching the device.
  Model(const ModelConfig& cfg, DType dtype) : cfg_(cfg), dtype_(dtype) { plan(); }

  Model(const ModelConfig& cfg, ModelOptions opts, GenerationConfig generation)
      : cfg_(cfg), generation_(std::move(generation)), dtype_(opts.dtype) {
    cfg_.validate();
    if (dtype_ != DType::kBF16 && dtype_ != DType::kF32) {
      throw_error(StatusCode::kUnsupported, "cuda::Model: storage dtype ", dtype_name(dtype_), " (BF16 or F32)");
    }
    plan();
    require_device();
    check_fits("cuda::Model (" + std::string(dtype_name(dtype_)) + " parameters of " + cfg_.source + ")", arena_bytes_);
    arena_ = DeviceBuffer<std::byte>(arena_bytes_, "model parameters");
  }

  TensorRef place(std::int64_t count, DType dtype) {
    TensorRef t;
    if (count <= 0) return t;
    arena_bytes_ = (arena_bytes_ + 255) / 256 * 256;
    t.offset = arena_bytes_;
    t.count = count;
    t.dtype = dtype;
    arena_bytes_ += t.bytes();
    return t;
  }

  void plan() {
    const std::int64_t H = cfg_.hidden_size, V = cfg_.vocab_size, I = cfg_.intermediate_size, Hq = cfg_.num_heads;
    const DType M = dtype_, F = DType::kF32;
    embed_ = place(V * H, M);
    final_norm_ = place(H, F);
    layers_.assign(cfg_.layers.size(), DeviceLayer{});
    for (std::size_t l = 0; l < cfg_.layers.size(); ++l) {
      const LayerSpec& s = cfg_.layers[l];
      DeviceLayer& L = layers_[l];
      const std::int64_t D = s.head_dim, Hkv = s.num_kv_heads;
      L.qkv_rows = (Hq + Hkv * (s.has_v_proj ? 2 : 1)) * D;
      L.qkv = place(L.qkv_rows * H, M);
      L.o_proj = place(H * Hq * D, M);
      L.mlp_gate_up = place(2 * I * H, M);
      L.mlp_down = place(H * I, M);
      L.q_norm = place(D, F);
      L.k_norm = place(D, F);
      for (TensorRef* t : {&L.input_layernorm, &L.post_attention_layernorm, &L.pre_feedforward_layernorm,
                           &L.post_feedforward_layernorm}) {
        *t = place(H, F);
      }
      if (cfg_.enable_moe_block) {
        const std::int64_t E = cfg_.num_experts, Im = cfg_.moe_intermediate_size;
        for (TensorRef* t : {&L.post_feedforward_layernorm_1, &L.pre_feedforward_layernorm_2,
                             &L.post_feedforward_layernorm_2, &L.router_scale}) {
          *t = place(H, F);
        }
        L.router_per_expert_scale = place(E, F);
        L.router_proj = place(E * H, M);
        L.experts_gate_up = place(E * 2 * Im * H, M);
        L.experts_down = place(E * H * Im, M);
      }
    }
    if (cfg_.is_diffusion()) {
      sc_pre_norm_ = place(H, F);
      sc_gate_up_ = place(2 * I * H, M);
      sc_down_ = place(H * I, M);
    }
    arena_bytes_ = (arena_bytes_ + 255) / 256 * 256;
  }

  // Copies `src` into `dst` starting at element `at`, converting to dst's dtype on the host in
  // bounded chunks (or straight from the mapped file when the dtypes already agree).
  void put(const std::string& name, const RawTensor& src, const TensorRef& dst, std::int64_t at, std::int64_t count) {
    if (src.empty()) throw_error(StatusCode::kNotFound, "cuda::Model: tensor '", name, "' is missing");
    if (src.shape.numel() != count) {
      throw_error(StatusCode::kInvalidArgument, "cuda::Model: tensor '", name, "' has shape ", src.shape.str(), " (",
                  src.shape.numel(), " elements), expected ", count, " elements for ", cfg_.source);
    }
    if (at < 0 || at + count > dst.count) {
      throw_error(StatusCode::kInternal, "cuda::Model: '", name, "' does not fit its fused destination");
    }
    const std::size_t esize = dtype_size(dst.dtype);
    std::byte* out = arena_.data() + dst.offset + static_cast<std::size_t>(at) * esize;
    if (src.dtype == dst.dtype && src.nbytes == static_cast<std::size_t>(count) * esize) {
      DG_CUDA_CHECK(cudaMemcpy(out, src.data, src.nbytes, cudaMemcpyHostToDevice));
      return;
    }
    constexpr std::int64_t kChunk = std::int64_t{1} << 22;
    std::vector<std::byte> staging(static_cast<std::size_t>(std::min(count, kChunk)) * esize);
    for (std::int64_t i0 = 0; i0 < count; i0 += kChunk) {
      const std::int64_t n = std::min(kChunk, count - i0);
      for (std::int64_t i = 0; i < n; ++i) {
        const float f = load_as_float(src, i0 + i);
        if (dst.dtype == DType::kF32) {
          std::memcpy(staging.data() + i * 4, &f, 4);
        } else {
          const std::uint16_t b = bfloat16::from_float(f).bits;
          std::memcpy(staging.data() + i * 2, &b, 2);
        }
      }
      DG_CUDA_CHECK(cudaMemcpy(out + static_cast<std::size_t>(i0) * esize, staging.data(),
                               static_cast<std::size_t>(n) * esize, cudaMemcpyHostToDevice));
    }
  }
  void put(const std::string& name, const RawTensor& src, const TensorRef& dst) { put(name, src, dst, 0, dst.count); }

  void upload(const ModelWeights& w) {
    const std::int64_t H = cfg_.hidden_size, I = cfg_.intermediate_size, Hq = cfg_.num_heads;
    if (w.layers.size() != cfg_.layers.size()) {
      throw_error(StatusCode::kInvalidArgument, "cuda::Model: ", w.layers.size(),
                  " layers of weights for a config with ", cfg_.layers.size(), " layers (", cfg_.source, ")");
    }
    put("embed_tokens", w.embed_tokens, embed_);
    put("norm", w.final_norm, final_norm_);
    for (std::size_t l = 0; l < layers_.size(); ++l) {
      const LayerSpec& s = cfg_.layers[l];
      const LayerWeights& src = w.layers[l];
      DeviceLayer& L = layers_[l];
      const std::string p = "layers." + std::to_string(l) + ".";
      const std::int64_t D = s.head_dim, Hkv = s.num_kv_heads;
      put(p + "self_attn.q_proj", src.q_proj, L.qkv, 0, Hq * D * H);
      put(p + "self_attn.k_proj", src.k_proj, L.qkv, Hq * D * H, Hkv * D * H);
      if (s.has_v_proj) put(p + "self_attn.v_proj", src.v_proj, L.qkv, (Hq + Hkv) * D * H, Hkv * D * H);
      put(p + "self_attn.o_proj", src.o_proj, L.o_proj);
      put(p + "self_attn.q_norm", src.q_norm, L.q_norm);
      put(p + "self_attn.k_norm", src.k_norm, L.k_norm);
      put(p + "input_layernorm", src.input_layernorm, L.input_layernorm);
      put(p + "post_attention_layernorm", src.post_attention_layernorm, L.post_attention_layernorm);
      put(p + "pre_feedforward_layernorm", src.pre_feedforward_layernorm, L.pre_feedforward_layernorm);
      put(p + "post_feedforward_layernorm", src.post_feedforward_layernorm, L.post_feedforward_layernorm);
      put(p + "mlp.gate_proj", src.mlp_gate, L.mlp_gate_up, 0, I * H);
      put(p + "mlp.up_proj", src.mlp_up, L.mlp_gate_up, I * H, I * H);
      put(p + "mlp.down_proj", src.mlp_down, L.mlp_down);
      L.layer_scalar = src.layer_scalar.empty() ? 1.0f : load_as_float(src.layer_scalar, 0);
      if (cfg_.enable_moe_block) {
        put(p + "post_feedforward_layernorm_1", src.post_feedforward_layernorm_1, L.post_feedforward_layernorm_1);
        put(p + "pre_feedforward_layernorm_2", src.pre_feedforward_layernorm_2, L.pre_feedforward_layernorm_2);
        put(p + "post_feedforward_layernorm_2", src.post_feedforward_layernorm_2, L.post_feedforward_layernorm_2);
        put(p + "router.proj", src.router_proj, L.router_proj);
        put(p + "router.scale", src.router_scale, L.router_scale);
        put(p + "router.per_expert_scale", src.router_per_expert_scale, L.router_per_expert_scale);
        put(p + "experts.gate_up_proj", src.experts_gate_up, L.experts_gate_up);
        put(p + "experts.down_proj", src.experts_down, L.experts_down);
      }
    }
    if (cfg_.is_diffusion()) {
      const SelfConditioningWeights& sc = w.self_conditioning;
      put("self_conditioning.pre_norm", sc.pre_norm, sc_pre_norm_);
      put("self_conditioning.gate_proj", sc.gate_proj, sc_gate_up_, 0, I * H);
      put("self_conditioning.up_proj", sc.up_proj, sc_gate_up_, I * H, I * H);
      put("self_conditioning.down_proj", sc.down_proj, sc_down_);
    }
  }

  ModelConfig cfg_;
  GenerationConfig generation_;
  DType dtype_ = DType::kBF16;
  float embed_scale_ = 1.0f;
  TensorRef embed_, final_norm_, sc_pre_norm_, sc_gate_up_, sc_down_;
  std::vector<DeviceLayer> layers_;
  std::size_t arena_bytes_ = 0;
  DeviceBuffer<std::byte> arena_;
};

}  // namespace diffusion_gemma::cuda
