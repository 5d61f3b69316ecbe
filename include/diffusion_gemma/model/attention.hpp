// SPDX-License-Identifier: Apache-2.0
// Attention policies: which cached and new keys a query may see, in each mode. The rule is a
// DG_HOST_DEVICE function, so the CPU loops and the CUDA kernels apply the same masks.
#pragma once

#include <cstdint>
#include <type_traits>

#include <diffusion_gemma/core/macros.hpp>
#include <diffusion_gemma/model/config.hpp>

namespace diffusion_gemma {

enum class AttentionMode {
  kEncoder,   // causal over new tokens; writes the KV cache (prefill, canvas commit)
  kDenoiser,  // bidirectional over the canvas; reads the cache, never writes it
  kSentinel
};

// Gemma 4 attention with transformers' DiffusionGemma semantics (docs/model.md §5.1-5.2):
// - encoder: key j visible to query i iff j <= i, and on sliding layers i - window < j
//   (window keys including self);
// - denoiser: every canvas key; on full layers every cached key; on sliding layers the same last
//   window - 1 cached keys for every canvas query (the window does not slide inside the canvas).
struct Gemma4Attention {
  // `pass_begin` is the first position of the current pass (the cache length before it).
  static DG_HOST_DEVICE bool visible(AttentionMode mode, LayerType type, int window, std::int64_t query_pos,
                                     std::int64_t key_pos, std::int64_t pass_begin) {
    if (mode == AttentionMode::kEncoder) {
      if (key_pos > query_pos) return false;
      return type == LayerType::kFull || key_pos > query_pos - window;
    }
    if (key_pos >= pass_begin) return true;
    return type == LayerType::kFull || key_pos >= pass_begin - (window - 1);
  }

  // First cached position any query of the pass can see: lets back-ends skip older keys.
  static DG_HOST_DEVICE std::int64_t first_visible_cached(AttentionMode mode, LayerType type, int window,
                                                          std::int64_t pass_begin) {
    if (type == LayerType::kFull) return 0;
    const std::int64_t lo = mode == AttentionMode::kEncoder ? pass_begin - window + 1 : pass_begin - (window - 1);
    return lo > 0 ? lo : 0;
  }
};

// Google's JAX sampler semantics for the canvas (docs/model.md §5.3): the prefix window of a sliding
// layer is AND-ed with a per-position window, so canvas query i sees the last window - 1 - i
// prefix tokens. A research variant, not the reference: a one-type swap in Backbone.
struct JaxCanvasAttention {
  static DG_HOST_DEVICE bool visible(AttentionMode mode, LayerType type, int window, std::int64_t query_pos,
                                     std::int64_t key_pos, std::int64_t pass_begin) {
    if (mode == AttentionMode::kDenoiser && type == LayerType::kSliding && key_pos < pass_begin) {
      return key_pos >= pass_begin - (window - 1) && key_pos > query_pos - window;
    }
    return Gemma4Attention::visible(mode, type, window, query_pos, key_pos, pass_begin);
  }
  static DG_HOST_DEVICE std::int64_t first_visible_cached(AttentionMode mode, LayerType type, int window,
                                                          std::int64_t pass_begin) {
    return Gemma4Attention::first_visible_cached(mode, type, window, pass_begin);
  }
};

// A policy may also take a seventh argument, the sequence's index in a batched pass (its place
// among the pass's sequences, as flashinfer's attention variants get the batch index), to mask
// sequences differently. Masks that use it make a sequence's result depend on where it runs.
template <class A, class = void>
struct takes_sequence_index : std::false_type {};
template <class A>
struct takes_sequence_index<A, std::void_t<decltype(static_cast<bool (*)(AttentionMode, LayerType, int, std::int64_t,
                                                                         std::int64_t, std::int64_t, int)>(&A::visible))>>
    : std::true_type {};

template <class A, class = void>
struct has_plain_visible : std::false_type {};
template <class A>
struct has_plain_visible<A, std::void_t<decltype(static_cast<bool (*)(AttentionMode, LayerType, int, std::int64_t,
                                                                      std::int64_t, std::int64_t)>(&A::visible))>>
    : std::true_type {};

template <class A, class = void>
struct has_first_visible_cached : std::false_type {};
template <class A>
struct has_first_visible_cached<A, std::void_t<decltype(static_cast<std::int64_t (*)(AttentionMode, LayerType, int, std::int64_t)>(
                                       &A::first_visible_cached))>> : std::true_type {};

template <class A>
struct is_attention_policy
    : std::integral_constant<bool, (has_plain_visible<A>::value || takes_sequence_index<A>::value) &&
                                       has_first_visible_cached<A>::value> {};

// Whether key_pos is visible to query_pos in sequence `sequence` of the pass, through whichever
// form of visible() the policy has.
template <class A>
DG_HOST_DEVICE bool attention_visible(AttentionMode mode, LayerType type, int window, std::int64_t query_pos,
                                      std::int64_t key_pos, std::int64_t pass_begin, int sequence) {
  if constexpr (takes_sequence_index<A>::value) {
    return A::visible(mode, type, window, query_pos, key_pos, pass_begin, sequence);
  } else {
    (void)sequence;
    return A::visible(mode, type, window, query_pos, key_pos, pass_begin);
  }
}

}  // namespace diffusion_gemma
