// SPDX-License-Identifier: Apache-2.0
// The batch contract every engine's encode_batch / denoise_step_batch keeps (docs/serving.md, "How
// a batch runs"): every item is checked before any work, so a bad item leaves no cache advanced and
// no self-conditioning state touched; an empty encode item is a no-op; two encode items never share
// one cache. `check_cache(cache)` is the engine's own layout check.
#pragma once

#include <cstddef>
#include <cstdint>

#include <diffusion_gemma/core/status.hpp>
#include <diffusion_gemma/model/config.hpp>
#include <diffusion_gemma/model/input_checks.hpp>
#include <diffusion_gemma/sampler/batch_items.hpp>

namespace diffusion_gemma {

template <class Cache, class CheckCache>
void check_encode_items(const ModelConfig& cfg, const EncodeItem<Cache>* items, std::size_t count,
                        CheckCache&& check_cache) {
  for (std::size_t i = 0; i < count; ++i) {
    const EncodeItem<Cache>& it = items[i];
    if (it.cache == nullptr || it.n < 0 || (it.n > 0 && it.ids == nullptr)) {
      throw_error(StatusCode::kInvalidArgument, "encode_batch: item ", i, " has no cache or no tokens");
    }
    for (std::size_t j = 0; j < i; ++j) {
      if (items[j].cache == it.cache) {
        throw_error(StatusCode::kInvalidArgument, "encode_batch: items ", j, " and ", i, " share one KV cache");
      }
    }
    if (it.n > 0) check_token_ids(cfg, it.ids, it.n, "encoder input");
    check_cache(*it.cache);
    if (it.cache->length() + it.n > it.cache->capacity()) {
      throw_error(StatusCode::kOutOfRange, "encode_batch: item ", i, ": ", it.n, " tokens after ", it.cache->length(),
                  " cached positions exceed the KV cache capacity of ", it.cache->capacity());
    }
    check_positions(cfg, it.cache->length() + it.n);
  }
}

template <class Cache, class DenoiseState, class CheckCache>
void check_denoise_items(const ModelConfig& cfg, const DenoiseItem<Cache, DenoiseState>* items, std::size_t count,
                         CheckCache&& check_cache) {
  if (!cfg.is_diffusion()) {
    throw_error(StatusCode::kUnsupported, cfg.source, ": denoising needs a DiffusionGemma checkpoint");
  }
  for (std::size_t i = 0; i < count; ++i) {
    const DenoiseItem<Cache, DenoiseState>& it = items[i];
    if (it.cache == nullptr || it.stats == nullptr || it.state == nullptr || it.n <= 0 || it.canvas == nullptr) {
      throw_error(StatusCode::kInvalidArgument, "denoise_step_batch: item ", i,
                  " needs a canvas, a cache, a result and a state");
    }
    check_token_ids(cfg, it.canvas, it.n, "canvas");
    check_cache(*it.cache);
    check_positions(cfg, it.cache->length() + it.n);
  }
}

}  // namespace diffusion_gemma
