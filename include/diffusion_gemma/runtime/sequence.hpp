// SPDX-License-Identifier: Apache-2.0
// Sequence<Engine, Sampler, Scheduler>: one request's block-diffusion generation as a state
// machine that asks for engine passes instead of running them (docs/sampler.md §2). Decoder runs
// one Sequence with the engine's single-sequence calls; ContinuousBatcher and BatchDecoder run
// many, gathering their passes into batched engine calls. Every decision (initial canvas,
// acceptance, renoising, stopping, commit, PAD fill) is made here, from the sequence's own options
// and random key, so a sequence produces the same tokens alone or in any batch.
//
//   kEncode  -> encode_item() / encoded()     the prompt (prefill) or a committed canvas
//   kDenoise -> denoise_item() / denoised()   one denoising step of the current canvas
//   kDone    -> take_result()
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <sstream>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include <diffusion_gemma/core/status.hpp>
#include <diffusion_gemma/model/input_checks.hpp>
#include <diffusion_gemma/runtime/trace.hpp>
#include <diffusion_gemma/sampler/batch_items.hpp>
#include <diffusion_gemma/sampler/sampler.hpp>
#include <diffusion_gemma/sampler/vocab_stats.hpp>
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

// What Decoder, BatchDecoder and ContinuousBatcher take as their Sampler and Scheduler, checked
// before anything else can fail less readably; each asserts check_decoder_policies<...>().
template <class Sampler, class Scheduler>
constexpr bool check_decoder_policies() {
  static_assert(is_sampler<Sampler>::value,
                "Decoder / BatchDecoder / ContinuousBatcher<Engine, Sampler, Scheduler>: Sampler must be a "
                "Sampler<State, Conditioning, Acceptance, Schedule, Stopping, Rng> (sampler/sampler.hpp), not a "
                "policy on its own; see docs/policies.md");
  static_assert(is_canvas_scheduler<Scheduler>::value,
                "Decoder / BatchDecoder / ContinuousBatcher<Engine, Sampler, Scheduler>: Scheduler must be a "
                "CanvasScheduler<Blocks> (schedule/canvas_scheduler.hpp); a Blocks policy goes inside it; see "
                "docs/policies.md");
  return is_sampler<Sampler>::value && is_canvas_scheduler<Scheduler>::value;
}

template <class Sampler, class Scheduler>
struct DecodeOptions {
  typename Sampler::Arguments sampler{};
  typename Scheduler::Arguments scheduler{};
  std::size_t memory_budget_bytes = 0;  // KV cache + workspace a request may use; 0: no limit
};

// Options with the sampler and scheduler settings of a checkpoint's generation_config.json.
template <class Sampler, class Scheduler>
DecodeOptions<Sampler, Scheduler> default_decode_options(const GenerationConfig& g) {
  DecodeOptions<Sampler, Scheduler> o;
  apply_generation_config<Sampler>(g, o.sampler);
  apply_generation_config_to_scheduler<Scheduler>(g, o.scheduler);
  return o;
}

// KV cache + workspace of a planned request. The engine sizes its workspace by its largest pass:
// a prompt runs in encoder chunks, a canvas in one pass.
template <class Scheduler, class Engine>
std::size_t request_bytes_of(const Engine& engine, const typename Scheduler::Plan& p, std::int64_t prompt_length) {
  int longest = 0;
  for (int b = 0; b < p.num_canvases; ++b) {
    longest = std::max(longest, Scheduler::Blocks::canvas_length(engine.config(), b));
  }
  return engine.request_bytes(p.cache_capacity, prompt_length, longest);
}

// Checks options, positions and memory before any allocation or model work.
template <class Sampler, class Scheduler, class Engine>
typename Scheduler::Plan plan_request(const Engine& engine, std::int64_t prompt_length,
                                      const DecodeOptions<Sampler, Scheduler>& o) {
  throw_if_error(Sampler::can_implement(o.sampler));
  const auto p = Scheduler::plan(o.scheduler, engine.config(), prompt_length);
  if (o.memory_budget_bytes > 0) {
    const std::size_t need = request_bytes_of<Scheduler>(engine, p, prompt_length);
    if (need > o.memory_budget_bytes) {
      throw_error(StatusCode::kOutOfRange, "the request needs ", static_cast<double>(need) / (1 << 20),
                  " MiB (KV cache for ", p.cache_capacity, " positions and workspace) but the memory budget is ",
                  static_cast<double>(o.memory_budget_bytes) / (1 << 20), " MiB");
    }
  }
  return p;
}

template <class Engine, class Sampler, class Scheduler>
class Sequence {
 public:
  using Cache = typename Engine::Cache;
  using Options = DecodeOptions<Sampler, Scheduler>;
  using Plan = typename Scheduler::Plan;
  enum class Work { kEncode, kDenoise, kDone };

  // Plans the request (throws on bad options, token ids, positions or budget); allocates nothing.
  Sequence(const Engine& engine, std::vector<std::int32_t> prompt, const Options& o, Callbacks cb = {})
      : cfg_(&engine.config()),
        prompt_(std::move(prompt)),
        options_(o),
        callbacks_(std::move(cb)),
        plan_(plan_request<Sampler, Scheduler>(engine, static_cast<std::int64_t>(prompt_.size()), o)),
        rng_(o.sampler.rng),
        bytes_(request_bytes_of<Scheduler>(engine, plan_, static_cast<std::int64_t>(prompt_.size()))) {
    check_token_ids(*cfg_, prompt_.data(), static_cast<std::int64_t>(prompt_.size()), "prompt");
  }

  const Plan& plan() const { return plan_; }
  const Options& options() const { return options_; }
  const std::vector<std::int32_t>& prompt() const { return prompt_; }
  // KV cache + workspace this sequence needs while it runs (what admission counts).
  std::size_t bytes() const { return bytes_; }
  Work work() const { return work_; }
  bool started() const { return cache_ != nullptr || work_ == Work::kDone; }

  // Allocates the KV cache; the first work is the prompt's prefill.
  template <class E>
  void start(const E& engine) {
    t0_ = clock::now();
    cache_ = std::make_unique<Cache>(engine.make_cache(plan_.cache_capacity));
    position_ = static_cast<std::int64_t>(prompt_.size());
    work_ = Work::kEncode;
  }

  EncodeItem<Cache> encode_item() {
    EncodeItem<Cache> it;
    it.cache = cache_.get();
    if (committing_) {
      it.ids = draft_.data();
      it.n = C_;
    } else {
      it.ids = prompt_.data();
      it.n = static_cast<std::int64_t>(prompt_.size());
    }
    return it;
  }

  void encoded() {
    if (committing_) {
      committing_ = false;
      complete_canvas();
    } else {
      result_.prefill_seconds = since(t0_);
      begin_canvas(0);
    }
  }

  template <class DenoiseState>
  DenoiseItem<Cache, DenoiseState> denoise_item(DenoiseState* state) {
    ts_ = clock::now();
    const int N = options_.sampler.max_denoising_steps;
    DenoiseItem<Cache, DenoiseState> it;
    it.canvas = canvas_.data();
    it.n = C_;
    it.first_step = s_ == 0;
    it.cache = cache_.get();
    it.args.temperature = Sampler::Schedule::temperature(options_.sampler.schedule, N - s_, N);
    // The pass divides the logits by T: at 0 (a "greedy" schedule) or below, or at NaN, its
    // statistics are finite but meaningless, and the step would go on with them.
    if (!(it.args.temperature > 0.0f) || !(it.args.temperature - it.args.temperature == 0.0f)) {
      throw_error(StatusCode::kInvalidArgument, "the Schedule policy's temperature at canvas ", b_, ", step ", s_, " is ",
                  it.args.temperature, "; it must be positive and finite");
    }
    it.args.soft_embedding = Sampler::Conditioning::kEnabled;  // SC is reset at every canvas: s == 0
    it.args.sample = !Sampler::Rng::kReplaysSamples;
    it.args.key = rng_.key(b_, s_);
    it.stats = &stats_;
    it.state = state;
    return it;
  }

  // The sampler's part of the step, on the statistics the engine wrote into the item's `stats`.
  void denoised() {
    const int N = options_.sampler.max_denoising_steps;
    const std::int64_t V = cfg_->vocab_size;
    const int C = C_, s = s_, n = N - s_;
    ++result_.forwards;  // every pass that ran, the one whose logits are refused below included
    // Finite logits always give a finite entropy and ids inside the vocabulary. A NaN or Inf comes
    // from weights or config values that overflow fp32; sampling from it would put arbitrary ids
    // (or none) on the canvas, so the generation stops here and says why.
    for (int i = 0; i < C; ++i) {
      const float h = stats_.entropy[i];
      const std::int32_t id = Sampler::Rng::kReplaysSamples ? stats_.argmax[i] : stats_.sample[i];
      if (!(h - h == 0.0f) || stats_.argmax[i] < 0 || stats_.argmax[i] >= V || id < 0 || id >= V) {
        // A temperature so small that logits / T overflows gives the same symptom as bad weights.
        const double T = Sampler::Schedule::temperature(options_.sampler.schedule, n, N);
        std::ostringstream why;
        why << "non-finite logits at canvas " << b_ << ", step " << s << ", position " << i << " (entropy " << h
            << ", temperature " << T << "): ";
        if (T < 1e-30) {
          why << "the temperature is too small for fp32 (logits / temperature overflow; raise t_min / t_max)";
        } else {
          why << "the checkpoint's weights or config values overflow fp32 (`dgemma generate --check-weights` names NaN "
                 "or Inf weights)";
        }
        throw Error(StatusCode::kFormatError, why.str());
      }
    }
    for (int i = 0; i < C; ++i) {
      if constexpr (Sampler::Rng::kReplaysSamples) {
        candidate_[i] = rng_.sample(b_, s, i, V);
      } else {
        candidate_[i] = stats_.sample[i];
      }
    }
    const StepView view{stats_.argmax.data(), candidate_.data(), stats_.entropy.data(), C, s, n};
    // An Acceptance policy marks the positions it keeps; the rest must read 0, not the last step's.
    std::fill(accepted_.begin(), accepted_.end(), std::uint8_t{0});  // sized to this canvas in begin_canvas
    Sampler::Acceptance::accept(options_.sampler.acceptance, view, acceptance_state_, accepted_.data());
    StepRecord sr;
    sr.canvas = b_;
    sr.step = s;
    sr.steps_remaining = n;
    sr.temperature = Sampler::Schedule::temperature(options_.sampler.schedule, n, N);
    for (int i = 0; i < C; ++i) {
      if (accepted_[i]) {
        canvas_[i] = candidate_[i];
      } else {
        canvas_[i] = Sampler::renoise(options_.sampler, rng_, b_, s, i, V);
        check_state_token(canvas_[i], i, "renoise");
      }
      sr.accepted += accepted_[i];
      sr.draft_changes += stats_.argmax[i] != draft_[i];
      sr.max_entropy = std::max(sr.max_entropy, stats_.entropy[i]);
    }
    double sum = 0.0;
    for (int i = 0; i < C; ++i) sum += stats_.entropy[i];
    sr.mean_entropy = static_cast<float>(sum / C);
    draft_.assign(stats_.argmax.begin(), stats_.argmax.begin() + C);
    const bool stop = Sampler::Stopping::update(options_.sampler.stopping, view, stopping_state_);
    if constexpr (std::is_same_v<typename Sampler::Stopping::State, StableAndConfident::State>) {
      sr.stable = stopping_state_.stable;
      sr.confident = stopping_state_.confident;
    }
    sr.seconds = since(ts_);
    result_.steps.push_back(sr);
    rec_.steps = s + 1;
    if (callbacks_.on_step && !callbacks_.on_step(StepEvent{result_.steps.back(), draft_.data(), accepted_.data(),
                                                             stats_.entropy.data(), canvas_.data(), C})) {
      cancel();
      return;
    }
    if (stop) {
      rec_.stop = CanvasStop::kConverged;
      end_canvas();
    } else if (s + 1 == N) {
      end_canvas();
    } else {
      ++s_;
    }
  }

  // Ends the request now (a callback, a client or the server asked): the canvas being denoised is
  // recorded as cancelled; the KV cache is freed.
  void cancel() {
    if (work_ == Work::kDone) return;
    if ((work_ == Work::kDenoise || committing_) && !rec_recorded_) {
      if (committing_) {
        // Finalised but not committed (no on_commit has shown it): its tokens leave the result,
        // as a canvas cancelled while denoising has none, so a stream and the result agree.
        result_.tokens.resize(result_.tokens.size() - static_cast<std::size_t>(C_));
        rec_.valid_tokens = 0;
        rec_.stop_token = false;
      }
      rec_.stop = CanvasStop::kCancelled;
      rec_.seconds = since(tc_);
      result_.canvases.push_back(rec_);
    }
    cancelled_ = true;
    finish();
  }

  bool cancelled() const { return cancelled_; }
  const GenerationResult& result() const { return result_; }
  GenerationResult take_result() { return std::move(result_); }

 private:
  using clock = std::chrono::steady_clock;
  static double since(clock::time_point a) { return std::chrono::duration<double>(clock::now() - a).count(); }

  // The State policy's tokens go into the next pass, where one outside the vocabulary would fail
  // every sequence of that pass: it ends this request here instead, named.
  void check_state_token(std::int32_t id, int position, const char* what) const {
    if (id < 0 || id >= cfg_->vocab_size) {
      throw_error(StatusCode::kInvalidArgument, "the State policy's ", what, " put token id ", id, " at canvas ", b_,
                  ", position ", position, ", outside the vocabulary [0, ", cfg_->vocab_size, ")");
    }
  }

  void begin_canvas(int b) {
    if (b >= plan_.num_canvases || finished_) {
      finish();
      return;
    }
    tc_ = clock::now();
    b_ = b;
    s_ = 0;
    C_ = Scheduler::Blocks::canvas_length(*cfg_, b);
    const std::size_t C = static_cast<std::size_t>(C_);
    canvas_.resize(C);
    candidate_.resize(C);
    accepted_.resize(C);
    Sampler::init_canvas(options_.sampler, rng_, b, cfg_->vocab_size, canvas_.data(), C_);
    for (int i = 0; i < C_; ++i) check_state_token(canvas_[static_cast<std::size_t>(i)], i, "init");
    Sampler::Stopping::reset(options_.sampler.stopping, stopping_state_);
    rec_ = CanvasRecord{};
    rec_recorded_ = false;
    rec_.canvas = b;
    rec_.position = position_;
    rec_.length = C_;
    rec_.stop = CanvasStop::kMaxSteps;
    draft_.assign(C, -1);
    work_ = Work::kDenoise;
  }

  // Commit the argmax canvas of the last executed step, never the sampled canvas.
  void end_canvas() {
    const auto fin = Scheduler::finalize(options_.scheduler, draft_.data(), C_);
    rec_.valid_tokens = fin.first;
    rec_.stop_token = fin.second;
    finished_ = fin.second;
    result_.tokens.insert(result_.tokens.end(), draft_.begin(), draft_.end());
    last_ = b_ + 1 == plan_.num_canvases;
    if (!finished_ && !last_) {  // causal re-encode at the canvas's own positions
      committing_ = true;
      work_ = Work::kEncode;
      return;
    }
    complete_canvas();
  }

  void complete_canvas() {
    position_ += C_;
    rec_.seconds = since(tc_);
    result_.canvases.push_back(rec_);
    rec_recorded_ = true;  // an on_commit that throws must not have it recorded again as cancelled
    if (b_ == 0) result_.first_commit_seconds = since(t0_);
    if (callbacks_.on_commit &&
        !callbacks_.on_commit(CommitEvent{result_.canvases.back(), draft_.data(), rec_.valid_tokens, finished_ || last_})) {
      cancelled_ = !(finished_ || last_);  // after the last canvas there is nothing left to cancel
      finish();
      return;
    }
    begin_canvas(b_ + 1);
  }

  void finish() {
    result_.finish = cancelled_ ? Finish::kCancelled : finished_ ? Finish::kStopToken : Finish::kMaxNewTokens;
    std::int64_t valid = 0;
    const int pad = options_.scheduler.pad_token_id;  // transformers counts every token when there is no PAD
    for (auto t : result_.tokens) valid += pad == kNoPadToken || t != pad;
    result_.tokens_per_forward = result_.forwards ? static_cast<double>(valid) / result_.forwards : 0.0;
    result_.seconds = since(t0_);
    committing_ = false;
    work_ = Work::kDone;
    cache_.reset();
  }

  const ModelConfig* cfg_;
  std::vector<std::int32_t> prompt_;
  Options options_;
  Callbacks callbacks_;
  Plan plan_;
  typename Sampler::Rng rng_;
  std::size_t bytes_ = 0;
  std::unique_ptr<Cache> cache_;
  Work work_ = Work::kEncode;
  bool committing_ = false, cancelled_ = false, finished_ = false, last_ = false;
  int b_ = 0, s_ = 0, C_ = 0;
  std::int64_t position_ = 0;
  std::vector<std::int32_t> canvas_, candidate_, draft_;
  std::vector<std::uint8_t> accepted_;
  VocabPassResult stats_;
  typename Sampler::Acceptance::State acceptance_state_{};
  typename Sampler::Stopping::State stopping_state_{};
  CanvasRecord rec_;
  bool rec_recorded_ = false;  // rec_ is in result_.canvases already
  GenerationResult result_;
  clock::time_point t0_, tc_, ts_;
};

}  // namespace diffusion_gemma
