// SPDX-License-Identifier: Apache-2.0
// cuda::KvCache: the device KV cache, with cpu::KvCache's semantics. Per layer and KV head, the
// keys (normed, roped) and values (normed) of every committed position, [kv_head][position][D],
// in the model's storage dtype. Preallocated to a capacity (one allocation, checked against free
// device memory first); encoder passes append, the denoiser only reads. Host code only.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include <diffusion_gemma/core/dtype.hpp>
#include <diffusion_gemma/core/status.hpp>
#include <diffusion_gemma/cuda/runtime.hpp>
#include <diffusion_gemma/model/config.hpp>
#include <diffusion_gemma/model/kv_layout.hpp>

namespace diffusion_gemma::cuda {

class KvCache {
 public:
  KvCache() = default;
  KvCache(const ModelConfig& cfg, std::int64_t capacity, DType dtype)
      : layout_(KvCacheLayout::of(cfg, dtype)), capacity_(capacity), dtype_(dtype) {
    if (capacity <= 0) {
      throw_error(StatusCode::kInvalidArgument, "KV cache capacity must be positive (got ", capacity, ")");
    }
    if (dtype != DType::kBF16 && dtype != DType::kF32) {
      throw_error(StatusCode::kUnsupported, "KV cache dtype ", dtype_name(dtype), " (BF16 or F32)");
    }
    std::size_t bytes = 0;
    layers_.resize(cfg.layers.size());
    for (std::size_t l = 0; l < cfg.layers.size(); ++l) {
      const LayerSpec& s = cfg.layers[l];
      Layer& L = layers_[l];
      L.kv_heads = s.num_kv_heads;
      L.head_dim = s.head_dim;
      const std::size_t n = static_cast<std::size_t>(s.num_kv_heads) * static_cast<std::size_t>(capacity) * s.head_dim;
      L.k_offset = align(bytes);
      L.v_offset = align(L.k_offset + n * dtype_size(dtype));
      bytes = L.v_offset + n * dtype_size(dtype);
    }
    bytes = align(bytes);
    check_fits("KV cache of " + std::to_string(capacity) + " positions", bytes);
    arena_ = DeviceBuffer<std::byte>(bytes, "KV cache");
  }

  // Bytes a cache of `capacity` positions needs for `cfg` in `dtype` (within alignment padding).
  static std::size_t bytes_for(const ModelConfig& cfg, std::int64_t capacity, DType dtype) {
    std::size_t b = 0;
    for (const auto& s : cfg.layers) {
      b += 2 * dtype_size(dtype) * static_cast<std::size_t>(s.num_kv_heads) * s.head_dim *
           static_cast<std::size_t>(capacity);
    }
    return b;
  }

  std::int64_t length() const { return length_; }
  std::int64_t capacity() const { return capacity_; }
  DType dtype() const { return dtype_; }
  // Layers, KV heads, head dims and element type, for the engine's compatibility check
  // (check_kv_cache_layout, model/kv_layout.hpp).
  const KvCacheLayout& layout() const { return layout_; }
  // Forgets positions >= n (for example to re-run a commit); never grows.
  void truncate(std::int64_t n) {
    if (n < 0 || n > length_) {
      throw_error(StatusCode::kInvalidArgument, "KvCache::truncate(", n, ") outside [0, ", length_, "]");
    }
    length_ = n;
  }

  // Base of layer l's keys / values: [kv_head][capacity][head_dim] elements of dtype().
  void* keys(int layer) { return arena_.data() + layers_[static_cast<std::size_t>(layer)].k_offset; }
  void* values(int layer) { return arena_.data() + layers_[static_cast<std::size_t>(layer)].v_offset; }
  const void* keys(int layer) const { return arena_.data() + layers_[static_cast<std::size_t>(layer)].k_offset; }
  const void* values(int layer) const { return arena_.data() + layers_[static_cast<std::size_t>(layer)].v_offset; }

  // Called by the engine once every layer of an encoder pass has written its positions.
  void advance(std::int64_t n) { length_ += n; }

 private:
  struct Layer {
    int kv_heads = 0;
    int head_dim = 0;
    std::size_t k_offset = 0, v_offset = 0;
  };
  static std::size_t align(std::size_t b) { return (b + 255) / 256 * 256; }

  std::vector<Layer> layers_;
  KvCacheLayout layout_;
  std::int64_t capacity_ = 0;
  std::int64_t length_ = 0;
  DType dtype_ = DType::kBF16;
  DeviceBuffer<std::byte> arena_;
};

}  // namespace diffusion_gemma::cuda
