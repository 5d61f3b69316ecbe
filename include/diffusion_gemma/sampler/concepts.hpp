// SPDX-License-Identifier: Apache-2.0
// Detection traits for sampler policies, so that Sampler<...> can say in one readable
// static_assert which member a policy is missing.
#pragma once

#include <cstdint>
#include <type_traits>
#include <utility>

#include <diffusion_gemma/core/rng.hpp>
#include <diffusion_gemma/core/status.hpp>
#include <diffusion_gemma/sampler/acceptance.hpp>

namespace diffusion_gemma {

namespace detail {
template <class...>
using void_t = void;
}

// State: Arguments, template init(rng, canvas, vocab, out, length) and renoise(rng, canvas, step,
// pos, vocab), each either as written or with the policy's Arguments first (init(args, rng, ...)):
// a policy with options (a mask token, a range of ids) reads them there. Checked with the
// Sampler's own Rng (R), so a State may use any of its members; DetectRng stands in for one
// when a State is checked alone.
struct DetectRng {
  DrawKey key(int, int) const { return {}; }
  std::int32_t token(DrawPurpose, int, int, int, std::int64_t) const { return 0; }
};
template <class P, class R, class = void>
struct has_state_init_with_arguments : std::false_type {};
template <class P, class R>
struct has_state_init_with_arguments<
    P, R, detail::void_t<decltype(P::init(std::declval<const typename P::Arguments&>(), std::declval<const R&>(), 0,
                                          std::int64_t{}, (std::int32_t*)nullptr, 0))>> : std::true_type {};
template <class P, class R, class = void>
struct has_state_init : std::false_type {};
template <class P, class R>
struct has_state_init<P, R, detail::void_t<decltype(P::init(std::declval<const R&>(), 0, std::int64_t{}, (std::int32_t*)nullptr, 0))>>
    : std::true_type {};
template <class P, class R, class = void>
struct has_state_renoise_with_arguments : std::false_type {};
template <class P, class R>
struct has_state_renoise_with_arguments<
    P, R, detail::void_t<decltype(std::int32_t{
              P::renoise(std::declval<const typename P::Arguments&>(), std::declval<const R&>(), 0, 0, 0, std::int64_t{})})>>
    : std::true_type {};
template <class P, class R, class = void>
struct has_state_renoise : std::false_type {};
template <class P, class R>
struct has_state_renoise<P, R, detail::void_t<decltype(std::int32_t{P::renoise(std::declval<const R&>(), 0, 0, 0, std::int64_t{})})>>
    : std::true_type {};
template <class P, class R = DetectRng, class = void>
struct is_state_policy : std::false_type {};
template <class P, class R>
struct is_state_policy<P, R, detail::void_t<typename P::Arguments>>
    : std::bool_constant<(has_state_init<P, R>::value || has_state_init_with_arguments<P, R>::value) &&
                         (has_state_renoise<P, R>::value || has_state_renoise_with_arguments<P, R>::value)> {};

// An optional static Status can_implement(const Arguments&) (State and Conditioning may have one),
// and whether P has a member of that name at all: one with another signature would otherwise be
// skipped without a word.
template <class P, class = void>
struct has_can_implement : std::false_type {};
template <class P>
struct has_can_implement<P, detail::void_t<decltype(Status{P::can_implement(std::declval<const typename P::Arguments&>())})>>
    : std::true_type {};
template <class P, class = void>
struct has_member_named_can_implement : std::false_type {};
template <class P>
struct has_member_named_can_implement<P, detail::void_t<decltype(&P::can_implement)>> : std::true_type {};

// Conditioning: Arguments and a static constexpr bool kEnabled.
template <class P, class = void>
struct is_conditioning_policy : std::false_type {};
template <class P>
struct is_conditioning_policy<P, detail::void_t<typename P::Arguments, decltype(bool{P::kEnabled})>> : std::true_type {};

// Whether P::State is default-constructible; true when P has no State, which the policy's own
// check reports (so a missing State gives that one message, not a second, raw one).
template <class P, class = void>
struct state_is_default_constructible : std::true_type {};
template <class P>
struct state_is_default_constructible<P, detail::void_t<typename P::State>>
    : std::is_default_constructible<typename P::State> {};

// Acceptance: Arguments, State, can_implement(Arguments), accept(Arguments, StepView, State&, uint8_t*).
template <class P, class = void>
struct is_acceptance_policy : std::false_type {};
template <class P>
struct is_acceptance_policy<
    P, detail::void_t<typename P::Arguments, typename P::State,
                      decltype(Status{P::can_implement(std::declval<const typename P::Arguments&>())}),
                      decltype(P::accept(std::declval<const typename P::Arguments&>(), std::declval<const StepView&>(),
                                         std::declval<typename P::State&>(), (std::uint8_t*)nullptr))>>
    : std::true_type {};

// Schedule: Arguments, can_implement, float temperature(Arguments, steps_remaining, max_steps).
template <class P, class = void>
struct is_schedule_policy : std::false_type {};
template <class P>
struct is_schedule_policy<
    P, detail::void_t<typename P::Arguments, decltype(Status{P::can_implement(std::declval<const typename P::Arguments&>())}),
                      decltype(float{P::temperature(std::declval<const typename P::Arguments&>(), 1, 1)})>>
    : std::true_type {};

// Stopping: Arguments, State, can_implement, reset(Arguments, State&), bool update(Arguments, StepView, State&).
template <class P, class = void>
struct is_stopping_policy : std::false_type {};
template <class P>
struct is_stopping_policy<
    P, detail::void_t<typename P::Arguments, typename P::State,
                      decltype(Status{P::can_implement(std::declval<const typename P::Arguments&>())}),
                      decltype(P::reset(std::declval<const typename P::Arguments&>(), std::declval<typename P::State&>())),
                      decltype(bool{P::update(std::declval<const typename P::Arguments&>(), std::declval<const StepView&>(),
                                              std::declval<typename P::State&>())})>> : std::true_type {};

// Rng: Arguments, constructor from Arguments, bool kReplaysSamples, key(canvas, step), token(...).
template <class P, class = void>
struct is_rng_policy : std::false_type {};
template <class P>
struct is_rng_policy<P, detail::void_t<typename P::Arguments, decltype(bool{P::kReplaysSamples}),
                                       decltype(P(std::declval<const typename P::Arguments&>())),
                                       std::enable_if_t<std::is_same_v<decltype(std::declval<const P&>().key(0, 0)), DrawKey>>,
                                       decltype(std::int32_t{std::declval<const P&>().token(DrawPurpose::kInit, 0, 0, 0,
                                                                                             std::int64_t{})})>>
    : std::true_type {};

// A replaying Rng (kReplaysSamples) also gives the recorded candidate: sample(canvas, step, position, vocab).
template <class P, class = void>
struct has_replayed_sample : std::false_type {};
template <class P>
struct has_replayed_sample<P, detail::void_t<decltype(std::int32_t{std::declval<const P&>().sample(0, 0, 0, std::int64_t{})})>>
    : std::true_type {};

}  // namespace diffusion_gemma
