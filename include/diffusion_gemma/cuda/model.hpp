// SPDX-License-Identifier: Apache-2.0
// cuda::Model: a backbone's parameters in device memory, immutable after construction and
// shareable between engines on the same device. Matrices and the embedding table are stored in
// BF16 (default) or F32 (the exactness mode that the parity tests use); norm weights, router
// scales and layer scalars stay F32 (they are widened once, as transformers' fp32 norm math does).
// Projections that read the same input are fused at upload: q|k|v rows, dense gate|up and the
// self-conditioning gate|up, so each is one GEMM.
//
// Built from host views of the weights (model/weights.hpp), as io::load_checkpoint binds them; the
// tensors are walked with for_each_parameter, the one list of a backbone's tensors. cuda/ never
// includes io/ or cpu/: the caller does the loading. Host code only: compiles without nvcc.
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
  float embed_scale = 0.0f;    // 0: sqrt(hidden) rounded to model_dtype(), as cpu::Model
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
    const DType src = w.embed_tokens.empty() ? opts.dtype : model_dtype(cfg, w);
    m->embed_scale_ = opts.embed_scale > 0.0f ? opts.embed_scale : embedding_scale(cfg.hidden_size, src);
    m->upload(w);
    return m;
  }

  // Every parameter allocated, contents undefined: benchmarks fill them on the device with random
  // values (launch_fill_uniform) so that no checkpoint and no host copy are needed.
  static std::shared_ptr<Model> uninitialized(const ModelConfig& cfg, ModelOptions opts = {}) {
    auto m = std::shared_ptr<Model>(new Model(cfg, opts, GenerationConfig{}));
    m->embed_scale_ = opts.embed_scale > 0.0f ? opts.embed_scale : embedding_scale(cfg.hidden_size, opts.dtype);
    return m;
  }

  // Bytes the parameters of `cfg` take on the device in storage dtype `dtype`.
  static std::size_t parameter_bytes(const ModelConfig& cfg, DType dtype) {
    Model m(cfg, dtype);
    return m.arena_bytes_;
  }

  Model(const Model&) = delete;  // placed_ points into this object
  Model& operator=(const Model&) = delete;

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

  // Calls f(name, ref, is_vector) for every device tensor (vectors: norms and scales, F32; fused
  // matrices under their fused names, e.g. "layers.3.qkv").
  template <class F>
  void for_each_parameter(F&& f) const {
    for (const Placed& p : placed_) f(p.name, *p.ref, p.is_vector);
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

  // Places every tensor of the one list (model/weights.hpp) in the arena; the projections that
  // read the same input get one fused destination each, placed at their first member.
  void plan() {
    const std::int64_t H = cfg_.hidden_size, I = cfg_.intermediate_size, Hq = cfg_.num_heads;
    layers_.assign(cfg_.layers.size(), DeviceLayer{});
    placed_.clear();
    ModelWeights shapes;
    shapes.layers.resize(cfg_.layers.size());
    diffusion_gemma::for_each_parameter(cfg_, shapes, [&](const ParamSpec& p, const Weight&) {
      TensorRef* ref = nullptr;
      std::int64_t count = p.shape.numel();
      std::string name = p.name;
      const std::string layer = p.layer >= 0 ? "layers." + std::to_string(p.layer) + "." : std::string();
      switch (p.param) {
        case Param::kLayerScalar:  // a host float per layer
        case Param::kKProj:
        case Param::kVProj:
        case Param::kMlpUp:
        case Param::kScUp: return;  // inside the fused tensor placed with the first member
        case Param::kQProj: {
          const LayerSpec& s = cfg_.layers[static_cast<std::size_t>(p.layer)];
          DeviceLayer& L = layers_[static_cast<std::size_t>(p.layer)];
          L.qkv_rows = (Hq + s.num_kv_heads * (s.has_v_proj ? 2 : 1)) * s.head_dim;
          ref = &L.qkv;
          count = L.qkv_rows * H;
          name = layer + "qkv";
          break;
        }
        case Param::kMlpGate:
          ref = &layers_[static_cast<std::size_t>(p.layer)].mlp_gate_up;
          count = 2 * I * H;
          name = layer + "mlp.gate_up";
          break;
        case Param::kScGate:
          ref = &sc_gate_up_;
          count = 2 * I * H;
          name = "self_conditioning.gate_up";
          break;
        default: ref = const_cast<TensorRef*>(destination(p).ref); break;
      }
      *ref = place(count, p.is_matrix() ? dtype_ : DType::kF32);
      placed_.push_back(Placed{name, ref, !p.is_matrix()});
    });
    arena_bytes_ = (arena_bytes_ + 255) / 256 * 256;
  }

  // Copies `w` into `dst` starting at element `at`, converting to dst's dtype on the host in
  // bounded chunks (or straight from the mapped file when the dtypes already agree).
  void put(const std::string& name, const Weight& w, const TensorRef& dst, std::int64_t at, std::int64_t count) {
    if (w.empty()) throw_error(StatusCode::kNotFound, "cuda::Model: tensor '", name, "' is missing");
    const RawTensor src = w.raw();
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

  // Where a checkpoint tensor lands in the arena: projections that read the same input share one
  // fused destination (q|k|v rows, gate|up rows), at an element offset.
  struct Destination {
    const TensorRef* ref = nullptr;
    std::int64_t at = 0, count = 0;
  };
  Destination destination(const ParamSpec& p) const {
    const std::int64_t H = cfg_.hidden_size, I = cfg_.intermediate_size, Hq = cfg_.num_heads;
    const auto whole = [](const TensorRef& t) { return Destination{&t, 0, t.count}; };
    if (p.layer < 0) {
      switch (p.param) {
        case Param::kEmbedTokens: return whole(embed_);
        case Param::kFinalNorm: return whole(final_norm_);
        case Param::kScPreNorm: return whole(sc_pre_norm_);
        case Param::kScGate: return Destination{&sc_gate_up_, 0, I * H};
        case Param::kScUp: return Destination{&sc_gate_up_, I * H, I * H};
        case Param::kScDown: return whole(sc_down_);
        default: break;
      }
      throw_error(StatusCode::kInternal, "cuda::Model: no destination for '", p.name, "'");
    }
    const LayerSpec& s = cfg_.layers[static_cast<std::size_t>(p.layer)];
    const DeviceLayer& L = layers_[static_cast<std::size_t>(p.layer)];
    const std::int64_t D = s.head_dim, Hkv = s.num_kv_heads;
    switch (p.param) {
      case Param::kQProj: return Destination{&L.qkv, 0, Hq * D * H};
      case Param::kKProj: return Destination{&L.qkv, Hq * D * H, Hkv * D * H};
      case Param::kVProj: return Destination{&L.qkv, (Hq + Hkv) * D * H, Hkv * D * H};
      case Param::kOProj: return whole(L.o_proj);
      case Param::kQNorm: return whole(L.q_norm);
      case Param::kKNorm: return whole(L.k_norm);
      case Param::kInputLayernorm: return whole(L.input_layernorm);
      case Param::kPostAttentionLayernorm: return whole(L.post_attention_layernorm);
      case Param::kPreFeedforwardLayernorm: return whole(L.pre_feedforward_layernorm);
      case Param::kPostFeedforwardLayernorm: return whole(L.post_feedforward_layernorm);
      case Param::kMlpGate: return Destination{&L.mlp_gate_up, 0, I * H};
      case Param::kMlpUp: return Destination{&L.mlp_gate_up, I * H, I * H};
      case Param::kMlpDown: return whole(L.mlp_down);
      case Param::kPostFeedforwardLayernorm1: return whole(L.post_feedforward_layernorm_1);
      case Param::kPreFeedforwardLayernorm2: return whole(L.pre_feedforward_layernorm_2);
      case Param::kPostFeedforwardLayernorm2: return whole(L.post_feedforward_layernorm_2);
      case Param::kRouterProj: return whole(L.router_proj);
      case Param::kRouterScale: return whole(L.router_scale);
      case Param::kRouterPerExpertScale: return whole(L.router_per_expert_scale);
      case Param::kExpertsGateUp: return whole(L.experts_gate_up);
      case Param::kExpertsDown: return whole(L.experts_down);
      default: break;
    }
    throw_error(StatusCode::kInternal, "cuda::Model: no destination for '", p.name, "'");
  }

  void upload(const ModelWeights& w) {
    if (w.layers.size() != cfg_.layers.size()) {
      throw_error(StatusCode::kInvalidArgument, "cuda::Model: ", w.layers.size(),
                  " layers of weights for a config with ", cfg_.layers.size(), " layers (", cfg_.source, ")");
    }
    diffusion_gemma::for_each_parameter(cfg_, w, [&](const ParamSpec& p, const Weight& src) {
      if (!src.is_dense()) {
        throw_error(StatusCode::kUnsupported, "cuda::Model: '", p.name, "' is ",
                    src.is_quantized() ? "quantized (" + src.quant->scheme + ")" : std::string("stored split per expert"),
                    "; the CUDA back-end runs plain F32/BF16/F16 checkpoints only (", cfg_.source, ")");
      }
      if (p.param == Param::kLayerScalar) {
        layers_[static_cast<std::size_t>(p.layer)].layer_scalar = src.empty() ? 1.0f : src.at(0);
        return;
      }
      const Destination d = destination(p);
      put(p.name, src, *d.ref, d.at, d.count);
    });
    // cudaMemcpy from pageable memory returns once the data is staged, not landed, and it runs on
    // the legacy default stream, which does not order the engines' non-blocking streams: without
    // this wait an engine's first kernels could read parameters still in flight.
    DG_CUDA_CHECK(cudaDeviceSynchronize());
  }

  ModelConfig cfg_;
  GenerationConfig generation_;
  DType dtype_ = DType::kBF16;
  float embed_scale_ = 1.0f;
  TensorRef embed_, final_norm_, sc_pre_norm_, sc_gate_up_, sc_down_;
  std::vector<DeviceLayer> layers_;
  struct Placed {
    std::string name;
    const TensorRef* ref;
    bool is_vector;
  };
  std::vector<Placed> placed_;
  std::size_t arena_bytes_ = 0;
  DeviceBuffer<std::byte> arena_;
};

}  // namespace diffusion_gemma::cuda
