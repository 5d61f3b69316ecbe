// SPDX-License-Identifier: Apache-2.0
// Decoder<Engine, Sampler, Scheduler>: block-diffusion generation (docs/sampler.md §2).
//
//   cache <- encode(prompt)                                  all prompt tokens, positions 0..P-1
//   for each canvas:                                         (Scheduler)
//     x <- State::init; soft <- none; Stopping::reset
//     for n = N .. 1:                                        Engine::denoise_step:
//       hidden <- denoise(x, soft, cache)                      reads the cache only
//       stats  <- vocab pass(hidden, T = Schedule(n))          argmax, candidate, entropy; soft kept
//       accept <- Acceptance(stats)                          recomputed every step, nothing locked
//       x      <- accept ? candidate : State::renoise
//       soft   <- stats.soft (Conditioning)
//       stop if Stopping(argmax, entropy)
//     commit argmax; PAD after the first stop id; encode it unless finished or last
//
// Swapping Engine (cpu::Engine -> cuda::Engine) changes the back-end; swapping a Sampler or
// Scheduler policy changes the algorithm. Callbacks see every step and commit and may cancel.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <functional>
#include <type_traits>
#include <utility>
#include <vector>

#include <diffusion_gemma/core/status.hpp>
#include <diffusion_gemma/sampler/vocab_stats.hpp>
#include <diffusion_gemma/runtime/engine_traits.hpp>
#include <diffusion_gemma/runtime/sequence.hpp>
#include <diffusion_gemma/runtime/trace.hpp>
#include <diffusion_gemma/sampler/sampler.hpp>
#include <diffusion_gemma/schedule/canvas_scheduler.hpp>

namespace diffusion_gemma {

template <class Engine_, class Sampler_ = ReferenceSampler, class Scheduler_ = CanvasScheduler<>>
class Decoder {
  static_assert(check_diffusion_engine<Engine_>(), "see runtime/engine_traits.hpp");
  static_assert(check_decoder_policies<Sampler_, Scheduler_>(), "see docs/policies.md");

 public:
  using Engine = Engine_;
  using Sampler = Sampler_;
  using Scheduler = Scheduler_;

  using Options = DecodeOptions<Sampler, Scheduler>;

  template <class... EngineArgs>
  explicit Decoder(EngineArgs&&... args) : engine_(std::forward<EngineArgs>(args)...) {}

  Engine& engine() { return engine_; }

  // The reference options of the loaded checkpoint (its generation_config.json).
  static Options default_options(const GenerationConfig& g) { return default_decode_options<Sampler, Scheduler>(g); }

  // Checks options, positions and memory before any allocation or model work.
  typename Scheduler::Plan plan(std::int64_t prompt_length, const Options& o) const {
    return plan_request<Sampler, Scheduler>(engine_, prompt_length, o);
  }

  // One sequence, run with the engine's single-sequence calls (the engine keeps the
  // self-conditioning state between the steps of a canvas). Not reentrant: a callback that calls
  // generate on the same Decoder would overwrite that state under the running generation, so it is
  // refused (another Decoder, or a BatchDecoder, runs sequences side by side).
  GenerationResult generate(const std::vector<std::int32_t>& prompt, const Options& o, const Callbacks& cb = {}) {
    if (running_) {
      throw_error(StatusCode::kInvalidArgument,
                  "Decoder::generate called from a callback of a generation running on the same Decoder");
    }
    struct Running {
      bool& flag;
      explicit Running(bool& f) : flag(f) { flag = true; }
      ~Running() { flag = false; }
    } running(running_);
    Sequence<Engine, Sampler, Scheduler> seq(engine_, prompt, o, cb);
    seq.start(engine_);
    while (seq.work() != Sequence<Engine, Sampler, Scheduler>::Work::kDone) {
      if (seq.work() == Sequence<Engine, Sampler, Scheduler>::Work::kEncode) {
        const auto it = seq.encode_item();
        engine_.encode(it.ids, it.n, *it.cache);
        seq.encoded();
      } else {
        const auto it = seq.template denoise_item<void>(nullptr);
        engine_.denoise_step(it.canvas, it.n, it.first_step, *it.cache, it.args, *it.stats);
        seq.denoised();
      }
    }
    return seq.take_result();
  }

 private:
  Engine engine_;
  bool running_ = false;
};

}  // namespace diffusion_gemma
