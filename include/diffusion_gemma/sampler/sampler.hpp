// SPDX-License-Identifier: Apache-2.0
// Sampler<State, Conditioning, Acceptance, Schedule, Stopping, Rng>: how one denoising step turns
// the vocabulary pass's per-position statistics into the next canvas, and when a canvas is done.
// The defaults reproduce transformers' DiffusionGemma generation; swapping a policy is one type:
//
//   using Reference = Sampler<>;                                   // UniformState, SelfConditioning,
//                                                                  // EntropyBound, LinearTemperature,
//                                                                  // StableAndConfident, PhiloxRng
//   using Mine = Sampler<UniformState, SelfConditioning, MyAcceptance, LinearTemperature, MyStop>;
//
// docs/policies.md lists what each policy must provide.
#pragma once

#include <cstdint>
#include <type_traits>
#include <vector>

#include <diffusion_gemma/core/status.hpp>
#include <diffusion_gemma/model/config.hpp>
#include <diffusion_gemma/sampler/acceptance.hpp>
#include <diffusion_gemma/sampler/concepts.hpp>
#include <diffusion_gemma/sampler/conditioning.hpp>
#include <diffusion_gemma/sampler/rng.hpp>
#include <diffusion_gemma/sampler/stopping.hpp>
#include <diffusion_gemma/sampler/temperature.hpp>
#include <diffusion_gemma/sampler/uniform_state.hpp>

namespace diffusion_gemma {

template <class State_ = UniformState, class Conditioning_ = SelfConditioning, class Acceptance_ = EntropyBound,
          class Schedule_ = LinearTemperature, class Stopping_ = StableAndConfident, class Rng_ = PhiloxRng>
class Sampler {
  static_assert(is_state_policy<State_, Rng_>::value,
                "Sampler<State, ...>: State must define Arguments, template init(rng, canvas, vocab, out, length) and "
                "renoise(rng, canvas, step, position, vocab), either of them optionally with const Arguments& first; "
                "see sampler/uniform_state.hpp and docs/policies.md");
  static_assert(!has_member_named_can_implement<State_>::value || has_can_implement<State_>::value,
                "Sampler<State, ...>: State's optional can_implement must be `static Status can_implement(const "
                "Arguments&)`");
  static_assert(!has_member_named_can_implement<Conditioning_>::value || has_can_implement<Conditioning_>::value,
                "Sampler<State, Conditioning, ...>: Conditioning's optional can_implement must be `static Status "
                "can_implement(const Arguments&)`");
  static_assert(is_conditioning_policy<Conditioning_>::value,
                "Sampler<State, Conditioning, ...>: Conditioning must define Arguments and static constexpr bool kEnabled; "
                "see sampler/conditioning.hpp");
  static_assert(is_acceptance_policy<Acceptance_>::value,
                "Sampler<..., Acceptance, ...>: Acceptance must define Arguments, State, static Status "
                "can_implement(const Arguments&) and static void accept(const Arguments&, const StepView&, State&, "
                "uint8_t* accepted); see sampler/acceptance.hpp");
  // Each request starts its Acceptance and Stopping State from State{}; without this check a State
  // with no default constructor fails deep inside runtime/sequence.hpp.
  static_assert(state_is_default_constructible<Acceptance_>::value,
                "Sampler<..., Acceptance, ...>: Acceptance::State must be default-constructible (every request "
                "starts from State{})");
  static_assert(is_schedule_policy<Schedule_>::value,
                "Sampler<..., Schedule, ...>: Schedule must define Arguments, can_implement and static float "
                "temperature(const Arguments&, int steps_remaining, int max_steps); see sampler/temperature.hpp");
  static_assert(is_stopping_policy<Stopping_>::value,
                "Sampler<..., Stopping, ...>: Stopping must define Arguments, State, can_implement, static void "
                "reset(const Arguments&, State&) and static bool update(const Arguments&, const StepView&, State&); "
                "see sampler/stopping.hpp");
  static_assert(state_is_default_constructible<Stopping_>::value,
                "Sampler<..., Stopping, ...>: Stopping::State must be default-constructible (every request starts "
                "from State{}, then reset)");
  static_assert(is_rng_policy<Rng_>::value,
                "Sampler<..., Rng>: Rng must define Arguments, a constructor from Arguments, kReplaysSamples, "
                "DrawKey key(canvas, step) and token(purpose, canvas, step, position, vocab); see sampler/rng.hpp");
  static_assert(!is_rng_policy<Rng_>::value || !Rng_::kReplaysSamples || has_replayed_sample<Rng_>::value,
                "Sampler<..., Rng>: an Rng with kReplaysSamples = true must define int32_t sample(canvas, step, "
                "position, vocab), the recorded candidate; see ReplayRng in sampler/rng.hpp");

 public:
  using State = State_;
  using Conditioning = Conditioning_;
  using Acceptance = Acceptance_;
  using Schedule = Schedule_;
  using Stopping = Stopping_;
  using Rng = Rng_;

  struct Arguments {
    int max_denoising_steps = 48;
    typename State::Arguments state{};
    typename Conditioning::Arguments conditioning{};
    typename Acceptance::Arguments acceptance{};
    typename Schedule::Arguments schedule{};
    typename Stopping::Arguments stopping{};
    typename Rng::Arguments rng{};
  };

  static Status can_implement(const Arguments& a) {
    if (a.max_denoising_steps <= 0) {
      return make_status(StatusCode::kInvalidArgument, "max denoising steps must be positive (got ", a.max_denoising_steps, ")");
    }
    for (const Status& s : {optional_can_implement<State>(a.state), optional_can_implement<Conditioning>(a.conditioning),
                            Acceptance::can_implement(a.acceptance), Schedule::can_implement(a.schedule),
                            Stopping::can_implement(a.stopping)}) {
      if (!s.ok()) return s;
    }
    return {};
  }

  // The State policy's first canvas and renoised tokens, with its Arguments where it takes them.
  static void init_canvas(const Arguments& a, const Rng& rng, int canvas, std::int64_t vocab, std::int32_t* out,
                          int length) {
    if constexpr (has_state_init_with_arguments<State, Rng>::value) {
      State::init(a.state, rng, canvas, vocab, out, length);
    } else {
      State::init(rng, canvas, vocab, out, length);
    }
  }
  static std::int32_t renoise(const Arguments& a, const Rng& rng, int canvas, int step, int position, std::int64_t vocab) {
    if constexpr (has_state_renoise_with_arguments<State, Rng>::value) {
      return State::renoise(a.state, rng, canvas, step, position, vocab);
    } else {
      return State::renoise(rng, canvas, step, position, vocab);
    }
  }

 private:
  template <class P>
  static Status optional_can_implement(const typename P::Arguments& a) {
    if constexpr (has_can_implement<P>::value) {
      return P::can_implement(a);
    } else {
      return {};
    }
  }
};

// Whether S is a Sampler<...>: what Decoder, BatchDecoder and ContinuousBatcher take.
template <class S>
struct is_sampler : std::false_type {};
template <class St, class Co, class Ac, class Sc, class Sp, class Rn>
struct is_sampler<Sampler<St, Co, Ac, Sc, Sp, Rn>> : std::true_type {};

// The checkpoint's generation_config.json as arguments of the reference policies, and of any
// policy that takes the same Arguments (one derived from a reference policy inherits them).
template <class S>
void apply_generation_config(const GenerationConfig& g, typename S::Arguments& a) {
  a.max_denoising_steps = g.max_denoising_steps;
  if constexpr (std::is_same_v<typename S::Acceptance::Arguments, EntropyBound::Arguments>) {
    a.acceptance.entropy_bound = g.entropy_bound;
  }
  if constexpr (std::is_same_v<typename S::Schedule::Arguments, LinearTemperature::Arguments>) {
    a.schedule.t_min = g.t_min;
    a.schedule.t_max = g.t_max;
  }
  if constexpr (std::is_same_v<typename S::Stopping::Arguments, StableAndConfident::Arguments>) {
    a.stopping.stability_threshold = g.stability_threshold;
    a.stopping.confidence_threshold = g.confidence_threshold;
  }
}

using ReferenceSampler = Sampler<>;
using ReplaySampler = Sampler<UniformState, SelfConditioning, EntropyBound, LinearTemperature, StableAndConfident, ReplayRng>;

}  // namespace diffusion_gemma
