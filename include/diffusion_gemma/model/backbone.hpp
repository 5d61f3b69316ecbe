// SPDX-License-Identifier: Apache-2.0
// Backbone<Attention, Experts>: the Gemma 4 decoder stack as a compile-time composition of an
// attention policy and a feed-forward policy. Model dimensions are runtime data (ModelConfig);
// execution lives in a back-end engine (cpu::Engine<Backbone>, cuda::Engine<Backbone>).
#pragma once

#include <diffusion_gemma/core/status.hpp>
#include <diffusion_gemma/model/attention.hpp>
#include <diffusion_gemma/model/config.hpp>
#include <diffusion_gemma/model/experts.hpp>

namespace diffusion_gemma {

template <class Attention_, class Experts_>
struct Backbone {
  static_assert(is_attention_policy<Attention_>::value,
                "Backbone<Attention, Experts>: Attention must provide static DG_HOST_DEVICE "
                "bool visible(AttentionMode, LayerType, int, int64_t, int64_t, int64_t) (optionally with a last int "
                "sequence index) and "
                "int64_t first_visible_cached(AttentionMode, LayerType, int, int64_t); see model/attention.hpp");
  static_assert(is_experts_policy<Experts_>::value,
                "Backbone<Attention, Experts>: Experts must provide static constexpr bool kMixtureOfExperts "
                "and const char* kName; see model/experts.hpp");
  using Attention = Attention_;
  using Experts = Experts_;

  // Whether this composition can run the checkpoint `cfg` describes.
  static Status can_implement(const ModelConfig& cfg) {
    if (cfg.enable_moe_block != Experts::kMixtureOfExperts) {
      return make_status(StatusCode::kUnsupported, cfg.source, ": enable_moe_block is ",
                         cfg.enable_moe_block ? "true" : "false", " but the backbone was composed with ", Experts::kName);
    }
    return {};
  }
};

using DiffusionGemmaBackbone = Backbone<Gemma4Attention, Gemma4MoE>;
using Gemma4DenseBackbone = Backbone<Gemma4Attention, DenseMlp>;

// The one runtime choke point from a config to a composed backbone type: calls
// f(Backbone<Gemma4Attention, Experts>{}) with the feed-forward policy the checkpoint needs.
template <class F>
decltype(auto) dispatch_backbone(const ModelConfig& cfg, F&& f) {
  if (cfg.enable_moe_block) return f(DiffusionGemmaBackbone{});
  return f(Gemma4DenseBackbone{});
}

}  // namespace diffusion_gemma
