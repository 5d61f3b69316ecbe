// SPDX-License-Identifier: Apache-2.0
// Feed-forward policies of a Gemma 4 layer (docs/model.md §3):
//   DenseMlp:  x = r + post_ff( mlp(pre_ff(r)) )
//   Gemma4MoE: x = r + post_ff( post_ff_1(mlp(pre_ff(r))) + post_ff_2(experts(pre_ff_2(r); router(r))) )
// The router sees the post-attention residual r itself, not a normalised copy.
#pragma once

#include <type_traits>

#include <diffusion_gemma/core/status.hpp>
#include <diffusion_gemma/model/config.hpp>

namespace diffusion_gemma {

struct DenseMlp {
  static constexpr bool kMixtureOfExperts = false;
  static constexpr const char* kName = "DenseMlp";
};

struct Gemma4MoE {
  static constexpr bool kMixtureOfExperts = true;
  static constexpr const char* kName = "Gemma4MoE";
};

template <class E, class = void>
struct is_experts_policy : std::false_type {};
template <class E>
struct is_experts_policy<E, std::void_t<decltype(bool{E::kMixtureOfExperts}), decltype(E::kName)>> : std::true_type {};

}  // namespace diffusion_gemma
