// SPDX-License-Identifier: Apache-2.0
// The shape of a KV cache as a plain descriptor (layers, KV heads and head_dim per layer, element
// type), and the check every engine call makes that a cache fits the engine it is passed to: a
// cache made for another model would otherwise be read and written out of bounds.
#pragma once

#include <cstddef>
#include <vector>

#include <diffusion_gemma/core/dtype.hpp>
#include <diffusion_gemma/core/status.hpp>
#include <diffusion_gemma/model/config.hpp>

namespace diffusion_gemma {

struct KvLayerShape {
  int kv_heads = 0;
  int head_dim = 0;
};

struct KvCacheLayout {
  std::vector<KvLayerShape> layers;
  DType dtype = DType::kF32;

  // The layout an engine over `cfg` storing K/V in `dtype` reads and writes.
  static KvCacheLayout of(const ModelConfig& cfg, DType dtype) {
    KvCacheLayout k;
    k.dtype = dtype;
    k.layers.reserve(cfg.layers.size());
    for (const LayerSpec& s : cfg.layers) k.layers.push_back(KvLayerShape{s.num_kv_heads, s.head_dim});
    return k;
  }
};

// OK when `cache` is what an engine over `cfg` with K/V in `dtype` needs; otherwise
// kInvalidArgument naming the first difference (layer count, a layer's KV heads or head_dim, dtype).
inline Status check_kv_cache_layout(const KvCacheLayout& cache, const ModelConfig& cfg, DType dtype) {
  if (cache.layers.size() != cfg.layers.size()) {
    return make_status(StatusCode::kInvalidArgument, "KV cache has ", cache.layers.size(),
                       " layers but the engine's model (", cfg.source, ") has ", cfg.layers.size(),
                       ": the cache was made for another model");
  }
  for (std::size_t l = 0; l < cfg.layers.size(); ++l) {
    const KvLayerShape& c = cache.layers[l];
    const LayerSpec& s = cfg.layers[l];
    if (c.kv_heads != s.num_kv_heads || c.head_dim != s.head_dim) {
      return make_status(StatusCode::kInvalidArgument, "KV cache layer ", l, " holds ", c.kv_heads,
                         " KV heads of head_dim ", c.head_dim, " but the engine's model (", cfg.source, ") has ",
                         s.num_kv_heads, " of head_dim ", s.head_dim, ": the cache was made for another model");
    }
  }
  if (cache.dtype != dtype) {
    return make_status(StatusCode::kInvalidArgument, "KV cache stores ", dtype_name(cache.dtype),
                       " but the engine stores K/V in ", dtype_name(dtype), " (make the cache with the engine's make_cache)");
  }
  return {};
}

}  // namespace diffusion_gemma
