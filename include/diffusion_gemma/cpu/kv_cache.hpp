// SPDX-License-Identifier: Apache-2.0
// The CPU KV cache: per layer and KV head, keys (normed, roped) and values (normed) of every
// committed position, [kv_head][position][head_dim] in fp32. Preallocated to a capacity; the
// denoiser reads it and never writes it.
#pragma once

#include <cstdint>
#include <vector>

#include <diffusion_gemma/core/dtype.hpp>
#include <diffusion_gemma/core/status.hpp>
#include <diffusion_gemma/model/config.hpp>
#include <diffusion_gemma/model/kv_layout.hpp>

namespace diffusion_gemma::cpu {

class KvCache {
 public:
  KvCache() = default;
  KvCache(const ModelConfig& cfg, std::int64_t capacity)
      : layout_(KvCacheLayout::of(cfg, DType::kF32)), capacity_(capacity) {
    if (capacity <= 0) throw_error(StatusCode::kInvalidArgument, "KV cache capacity must be positive (got ", capacity, ")");
    layers_.resize(cfg.layers.size());
    for (std::size_t l = 0; l < cfg.layers.size(); ++l) {
      const LayerSpec& s = cfg.layers[l];
      Layer& L = layers_[l];
      L.kv_heads = s.num_kv_heads;
      L.head_dim = s.head_dim;
      const std::size_t n = static_cast<std::size_t>(s.num_kv_heads) * capacity * s.head_dim;
      L.k.assign(n, 0.0f);
      L.v.assign(n, 0.0f);
    }
  }

  // Bytes a cache of `capacity` positions needs for `cfg` (fp32 keys and values).
  static std::size_t bytes_for(const ModelConfig& cfg, std::int64_t capacity) {
    std::size_t b = 0;
    for (const auto& s : cfg.layers) b += 2 * sizeof(float) * static_cast<std::size_t>(s.num_kv_heads) * s.head_dim * capacity;
    return b;
  }

  // Layers, KV heads, head dims and element type, for the engine's compatibility check.
  const KvCacheLayout& layout() const { return layout_; }

  std::int64_t length() const { return length_; }
  std::int64_t capacity() const { return capacity_; }
  // Forgets positions >= n (for example to re-run a commit); never grows.
  void truncate(std::int64_t n) {
    if (n < 0 || n > length_) throw_error(StatusCode::kInvalidArgument, "KvCache::truncate(", n, ") outside [0, ", length_, "]");
    length_ = n;
  }

  float* keys(int layer, int kv_head) { return layers_[layer].k.data() + offset(layer, kv_head); }
  float* values(int layer, int kv_head) { return layers_[layer].v.data() + offset(layer, kv_head); }
  const float* keys(int layer, int kv_head) const { return layers_[layer].k.data() + offset(layer, kv_head); }
  const float* values(int layer, int kv_head) const { return layers_[layer].v.data() + offset(layer, kv_head); }

  // Called by the engine once every layer of an encoder pass has written its positions.
  void advance(std::int64_t n) { length_ += n; }

 private:
  struct Layer {
    int kv_heads = 0;
    int head_dim = 0;
    std::vector<float> k, v;
  };
  std::size_t offset(int layer, int kv_head) const {
    return static_cast<std::size_t>(kv_head) * capacity_ * layers_[layer].head_dim;
  }
  std::vector<Layer> layers_;
  KvCacheLayout layout_;
  std::int64_t capacity_ = 0;
  std::int64_t length_ = 0;
};

}  // namespace diffusion_gemma::cpu
