// SPDX-License-Identifier: Apache-2.0
// What an engine (a back-end's model runner: cpu::Engine, cuda::Engine, or a research one) must
// provide to the decoders, checked at compile time with a message that names the missing member.
// docs/policies.md ("Engine") describes the contract in words.
//
// Decoder<Engine, ...> needs:
//   typename Engine::Cache                                   a KV cache type
//   const ModelConfig& config() const
//   Cache make_cache(std::int64_t capacity) const            positions the cache can hold
//   std::size_t request_bytes(std::int64_t capacity, std::int64_t prompt_tokens, std::int64_t canvas_tokens) const
//        memory beyond the weights: the KV cache and the workspace of the largest pass
//   void encode(const std::int32_t* ids, std::int64_t n, Cache& cache)
//        causal pass at positions cache.length().., appending K/V (prefill, canvas commit)
//   void denoise_step(const std::int32_t* canvas, std::int64_t n, bool first_step, const Cache& cache,
//                     const VocabPassArgs& args, VocabPassResult& stats)
//        one denoiser pass over the canvas plus the vocabulary pass; keeps the self-conditioning
//        state between the steps of a canvas (first_step: none yet)
// ContinuousBatcher<Engine, ...> and BatchDecoder<Engine, ...> need, beyond Decoder's:
//   typename Engine::DenoiseState                            a sequence's self-conditioning state
//   void encode_batch(const EncodeItem<Cache>* items, size_t count)
//   void denoise_step_batch(DenoiseItem<Cache, DenoiseState>* items, size_t count)
//        (sampler/batch_items.hpp); each item's results must not depend on the other items
// AutoregressiveDecoder<Engine> needs config(), make_cache(), and:
//   void encode(const std::int32_t* ids, std::int64_t n, Cache& cache, float* hidden_out)
//   void vocab_pass(const float* hidden, std::int64_t n, const VocabPassArgs& args, VocabPassResult& out)
#pragma once

#include <cstddef>
#include <cstdint>
#include <type_traits>
#include <utility>

#include <diffusion_gemma/model/config.hpp>
#include <diffusion_gemma/sampler/batch_items.hpp>
#include <diffusion_gemma/sampler/vocab_stats.hpp>

namespace diffusion_gemma {

namespace engine_detail {

template <class E, class = void>
struct has_cache : std::false_type {};
template <class E>
struct has_cache<E, std::void_t<typename E::Cache>> : std::true_type {};

template <class E, class = void>
struct has_config : std::false_type {};
template <class E>
struct has_config<E, std::enable_if_t<std::is_convertible_v<decltype(std::declval<const E&>().config()), const ModelConfig&>>>
    : std::true_type {};

template <class E, class = void>
struct has_make_cache : std::false_type {};
template <class E>
struct has_make_cache<E, std::enable_if_t<std::is_same_v<decltype(std::declval<const E&>().make_cache(std::int64_t{})),
                                                         typename E::Cache>>> : std::true_type {};

template <class E, class = void>
struct has_request_bytes : std::false_type {};
template <class E>
struct has_request_bytes<
    E, std::enable_if_t<std::is_convertible_v<
           decltype(std::declval<const E&>().request_bytes(std::int64_t{}, std::int64_t{}, std::int64_t{})),
           std::size_t>>>
    : std::true_type {};

template <class E, class = void>
struct has_encode : std::false_type {};
template <class E>
struct has_encode<E, std::void_t<decltype(std::declval<E&>().encode(std::declval<const std::int32_t*>(), std::int64_t{},
                                                                      std::declval<typename E::Cache&>()))>>
    : std::true_type {};

template <class E, class = void>
struct has_encode_hidden : std::false_type {};
template <class E>
struct has_encode_hidden<E, std::void_t<decltype(std::declval<E&>().encode(
                                std::declval<const std::int32_t*>(), std::int64_t{},
                                std::declval<typename E::Cache&>(), std::declval<float*>()))>> : std::true_type {};

template <class E, class = void>
struct has_denoise_step : std::false_type {};
template <class E>
struct has_denoise_step<E, std::void_t<decltype(std::declval<E&>().denoise_step(
                               std::declval<const std::int32_t*>(), std::int64_t{}, bool{},
                               std::declval<const typename E::Cache&>(), std::declval<const VocabPassArgs&>(),
                               std::declval<VocabPassResult&>()))>> : std::true_type {};

template <class E, class = void>
struct has_vocab_pass : std::false_type {};
template <class E>
struct has_vocab_pass<E, std::void_t<decltype(std::declval<E&>().vocab_pass(
                             std::declval<const float*>(), std::int64_t{}, std::declval<const VocabPassArgs&>(),
                             std::declval<VocabPassResult&>()))>> : std::true_type {};

template <class E, class = void>
struct has_denoise_state : std::false_type {};
template <class E>
struct has_denoise_state<E, std::void_t<typename E::DenoiseState>> : std::true_type {};

template <class E, class = void>
struct has_encode_batch : std::false_type {};
template <class E>
struct has_encode_batch<E, std::void_t<decltype(std::declval<E&>().encode_batch(
                               std::declval<const EncodeItem<typename E::Cache>*>(), std::size_t{}))>>
    : std::true_type {};

template <class E, class = void>
struct has_denoise_step_batch : std::false_type {};
template <class E>
struct has_denoise_step_batch<E, std::void_t<decltype(std::declval<E&>().denoise_step_batch(
                                     std::declval<DenoiseItem<typename E::Cache, typename E::DenoiseState>*>(),
                                     std::size_t{}))>> : std::true_type {};

}  // namespace engine_detail

// Compile-time check for Decoder's engine; fails with the missing member's signature.
template <class E>
constexpr bool check_diffusion_engine() {
  using namespace engine_detail;
  static_assert(has_cache<E>::value, "Decoder, BatchDecoder and ContinuousBatcher<Engine>: Engine must name its KV cache type `using Cache = ...` "
                                     "(runtime/engine_traits.hpp, docs/policies.md)");
  static_assert(has_config<E>::value, "Decoder, BatchDecoder and ContinuousBatcher<Engine>: Engine must provide `const ModelConfig& config() const`");
  static_assert(has_make_cache<E>::value, "Decoder, BatchDecoder and ContinuousBatcher<Engine>: Engine must provide `Cache make_cache(int64_t capacity) const`");
  static_assert(has_request_bytes<E>::value,
                "Decoder, BatchDecoder and ContinuousBatcher<Engine>: Engine must provide `size_t request_bytes(int64_t capacity, int64_t prompt_tokens, "
                "int64_t canvas_tokens) const`");
  static_assert(has_encode<E>::value,
                "Decoder, BatchDecoder and ContinuousBatcher<Engine>: Engine must provide `void encode(const int32_t* ids, int64_t n, Cache& cache)`");
  static_assert(has_denoise_step<E>::value,
                "Decoder, BatchDecoder and ContinuousBatcher<Engine>: Engine must provide `void denoise_step(const int32_t* canvas, int64_t n, bool "
                "first_step, const Cache& cache, const VocabPassArgs& args, VocabPassResult& stats)`");
  return true;
}

// Compile-time check for the engine of ContinuousBatcher and BatchDecoder.
template <class E>
constexpr bool check_batched_engine() {
  using namespace engine_detail;
  static_assert(check_diffusion_engine<E>(), "");
  static_assert(has_denoise_state<E>::value,
                "BatchDecoder and ContinuousBatcher<Engine>: Engine must name a sequence's self-conditioning state `using DenoiseState = ...`");
  static_assert(has_encode_batch<E>::value,
                "BatchDecoder and ContinuousBatcher<Engine>: Engine must provide `void encode_batch(const EncodeItem<Cache>* items, size_t count)`");
  if constexpr (has_denoise_state<E>::value) {
    static_assert(has_denoise_step_batch<E>::value,
                  "BatchDecoder and ContinuousBatcher<Engine>: Engine must provide `void denoise_step_batch(DenoiseItem<Cache, "
                  "DenoiseState>* items, size_t count)`");
  }
  return true;
}

// Compile-time check for AutoregressiveDecoder's engine.
template <class E>
constexpr bool check_autoregressive_engine() {
  using namespace engine_detail;
  static_assert(has_cache<E>::value, "AutoregressiveDecoder<Engine>: Engine must name its KV cache type `using Cache = ...`");
  static_assert(has_config<E>::value, "AutoregressiveDecoder<Engine>: Engine must provide `const ModelConfig& config() const`");
  static_assert(has_make_cache<E>::value,
                "AutoregressiveDecoder<Engine>: Engine must provide `Cache make_cache(int64_t capacity) const`");
  static_assert(has_encode_hidden<E>::value,
                "AutoregressiveDecoder<Engine>: Engine must provide `void encode(const int32_t* ids, int64_t n, "
                "Cache& cache, float* hidden_out)`");
  static_assert(has_vocab_pass<E>::value,
                "AutoregressiveDecoder<Engine>: Engine must provide `void vocab_pass(const float* hidden, int64_t n, "
                "const VocabPassArgs& args, VocabPassResult& out)`");
  return true;
}

}  // namespace diffusion_gemma
