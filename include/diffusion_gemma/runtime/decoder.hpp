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
#include <diffusion_gemma/runtime/trace.hpp>
#include <diffusion_gemma/sampler/sampler.hpp>
#include <diffusion_gemma/schedule/canvas_scheduler.hpp>

namespace diffusion_gemma {

struct StepEvent {
  const StepRecord& record;
  const std::int32_t* draft;     // argmax canvas of this step
  const std::uint8_t* accepted;  // 1 where the sampled candidate was kept
  const float* entropy;
  const std::int32_t* canvas;    // the canvas the next step will denoise
  int length;
};

struct CommitEvent {
  const CanvasRecord& record;
  const std::int32_t* tokens;  // the committed canvas (after PAD fill)
  int valid_tokens;            // up to and including a stop id
  bool final;
};

struct Callbacks {
  std::function<bool(const StepEvent&)> on_step;      // return false to cancel
  std::function<bool(const CommitEvent&)> on_commit;  // return false to cancel
};

template <class Engine_, class Sampler_ = ReferenceSampler, class Scheduler_ = CanvasScheduler<>>
class Decoder {
  static_assert(check_diffusion_engine<Engine_>(), "see runtime/engine_traits.hpp");

 public:
  using Engine = Engine_;
  using Sampler = Sampler_;
  using Scheduler = Scheduler_;

  struct Options {
    typename Sampler::Arguments sampler{};
    typename Scheduler::Arguments scheduler{};
    std::size_t memory_budget_bytes = 0;  // KV cache + workspace a request may use; 0: no limit
  };

  template <class... EngineArgs>
  explicit Decoder(EngineArgs&&... args) : engine_(std::forward<EngineArgs>(args)...) {}

  Engine& engine() { return engine_; }

  // The reference options of the loaded checkpoint (its generation_config.json).
  static Options default_options(const GenerationConfig& g) {
    Options o;
    apply_generation_config<Sampler>(g, o.sampler);
    apply_generation_config_to_scheduler<Scheduler>(g, o.scheduler);
    return o;
  }

  // Checks options, positions and memory before any allocation or model work.
  typename Scheduler::Plan plan(std::int64_t prompt_length, const Options& o) const {
    throw_if_error(Sampler::can_implement(o.sampler));
    const auto p = Scheduler::plan(o.scheduler, engine_.config(), prompt_length);
    if (o.memory_budget_bytes > 0) {
      int longest = 0;
      for (int b = 0; b < p.num_canvases; ++b) longest = std::max(longest, Scheduler::Blocks::canvas_length(engine_.config(), b));
      // The engine sizes its workspace by its largest pass: a prompt runs in encoder chunks.
      const std::size_t need = engine_.request_bytes(p.cache_capacity, prompt_length, longest);
      if (need > o.memory_budget_bytes) {
        throw_error(StatusCode::kOutOfRange, "the request needs ", static_cast<double>(need) / (1 << 20),
                    " MiB (KV cache for ", p.cache_capacity, " positions and workspace) but the memory budget is ",
                    static_cast<double>(o.memory_budget_bytes) / (1 << 20), " MiB");
      }
    }
    return p;
  }

  GenerationResult generate(const std::vector<std::int32_t>& prompt, const Options& o, const Callbacks& cb = {}) {
    using clock = std::chrono::steady_clock;
    const auto t0 = clock::now();
    const auto since = [](clock::time_point a) { return std::chrono::duration<double>(clock::now() - a).count(); };
    const ModelConfig& cfg = engine_.config();
    const auto plan = this->plan(static_cast<std::int64_t>(prompt.size()), o);
    const typename Sampler::Rng rng(o.sampler.rng);
    const std::int64_t V = cfg.vocab_size;
    const int N = o.sampler.max_denoising_steps;

    GenerationResult result;
    auto cache = engine_.make_cache(plan.cache_capacity);
    engine_.encode(prompt.data(), static_cast<std::int64_t>(prompt.size()), cache);
    result.prefill_seconds = since(t0);

    std::vector<std::int32_t> canvas, candidate, draft;
    std::vector<std::uint8_t> accepted;
    VocabPassResult stats;
    typename Sampler::Acceptance::State acceptance_state;
    typename Sampler::Stopping::State stopping_state;
    bool cancelled = false, finished = false;
    std::int64_t position = static_cast<std::int64_t>(prompt.size());

    for (int b = 0; b < plan.num_canvases && !cancelled && !finished; ++b) {
      const auto tc = clock::now();
      const int C = Scheduler::Blocks::canvas_length(cfg, b);
      canvas.resize(static_cast<std::size_t>(C));
      candidate.resize(static_cast<std::size_t>(C));
      accepted.resize(static_cast<std::size_t>(C));
      Sampler::State::init(rng, b, V, canvas.data(), C);
      Sampler::Stopping::reset(o.sampler.stopping, stopping_state);
      CanvasRecord rec;
      rec.canvas = b;
      rec.position = position;
      rec.length = C;
      rec.stop = CanvasStop::kMaxSteps;
      draft.assign(static_cast<std::size_t>(C), -1);
      for (int s = 0; s < N; ++s) {
        const auto ts = clock::now();
        const int n = N - s;
        const float T = Sampler::Schedule::temperature(o.sampler.schedule, n, N);
        VocabPassArgs va;
        va.temperature = T;
        va.soft_embedding = Sampler::Conditioning::kEnabled;  // SC is reset at every canvas: s == 0
        va.sample = !Sampler::Rng::kReplaysSamples;
        va.key = rng.key(b, s);
        engine_.denoise_step(canvas.data(), C, /*first_step=*/s == 0, cache, va, stats);
        ++result.forwards;
        for (int i = 0; i < C; ++i) {
          if constexpr (Sampler::Rng::kReplaysSamples) {
            candidate[i] = rng.sample(b, s, i, V);
          } else {
            candidate[i] = stats.sample[i];
          }
        }
        const StepView view{stats.argmax.data(), candidate.data(), stats.entropy.data(), C, s, n};
        Sampler::Acceptance::accept(o.sampler.acceptance, view, acceptance_state, accepted.data());
        StepRecord sr;
        sr.canvas = b;
        sr.step = s;
        sr.steps_remaining = n;
        sr.temperature = T;
        for (int i = 0; i < C; ++i) {
          canvas[i] = accepted[i] ? candidate[i] : Sampler::State::renoise(rng, b, s, i, V);
          sr.accepted += accepted[i];
          sr.draft_changes += stats.argmax[i] != draft[i];
          sr.max_entropy = std::max(sr.max_entropy, stats.entropy[i]);
        }
        double sum = 0.0;
        for (int i = 0; i < C; ++i) sum += stats.entropy[i];
        sr.mean_entropy = static_cast<float>(sum / C);
        draft.assign(stats.argmax.begin(), stats.argmax.begin() + C);
        const bool stop = Sampler::Stopping::update(o.sampler.stopping, view, stopping_state);
        if constexpr (std::is_same_v<typename Sampler::Stopping, StableAndConfident>) {
          sr.stable = stopping_state.stable;
          sr.confident = stopping_state.confident;
        }
        sr.seconds = since(ts);
        result.steps.push_back(sr);
        rec.steps = s + 1;
        if (cb.on_step && !cb.on_step(StepEvent{result.steps.back(), draft.data(), accepted.data(),
                                                stats.entropy.data(), canvas.data(), C})) {
          cancelled = true;
          rec.stop = CanvasStop::kCancelled;
          break;
        }
        if (stop) {
          rec.stop = CanvasStop::kConverged;
          break;
        }
      }
      if (cancelled) {
        rec.seconds = since(tc);
        result.canvases.push_back(rec);
        break;
      }
      // Commit the argmax canvas of the last executed step, never the sampled canvas.
      const auto fin = Scheduler::finalize(o.scheduler, draft.data(), C);
      rec.valid_tokens = fin.first;
      rec.stop_token = fin.second;
      finished = fin.second;
      result.tokens.insert(result.tokens.end(), draft.begin(), draft.end());
      const bool last = b + 1 == plan.num_canvases;
      if (!finished && !last) engine_.encode(draft.data(), C, cache);  // causal re-encode, same positions
      position += C;
      rec.seconds = since(tc);
      result.canvases.push_back(rec);
      if (b == 0) result.first_commit_seconds = since(t0);
      if (cb.on_commit &&
          !cb.on_commit(CommitEvent{result.canvases.back(), draft.data(), rec.valid_tokens, finished || last})) {
        cancelled = true;
      }
    }
    result.finish = cancelled ? Finish::kCancelled : finished ? Finish::kStopToken : Finish::kMaxNewTokens;
    std::int64_t valid = 0;
    for (auto t : result.tokens) valid += t != o.scheduler.pad_token_id;
    result.tokens_per_forward = result.forwards ? static_cast<double>(valid) / result.forwards : 0.0;
    result.seconds = since(t0);
    return result;
  }

 private:
  Engine engine_;
};

}  // namespace diffusion_gemma
