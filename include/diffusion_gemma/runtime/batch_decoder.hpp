// SPDX-License-Identifier: Apache-2.0
// BatchDecoder<Engine, Sampler, Scheduler>: generate() over a batch of prompts, with the results
// transformers' batched generate() gives (docs/serving.md, "Batched generation"):
//   - each row's tokens are the tokens that row gets alone: a row that converged early is frozen at
//     its last draft, and denoising it further changes nothing;
//   - `sequences` has transformers' layout: the prompts left-padded to the longest, then every
//     canvas the batch ran, with PAD after a row's stop id and in every canvas after it.
// transformers gives a left-padded row positions shifted by its padding and masks the padding;
// attention depends only on the distance between positions, so each row runs from position 0 here
// and no padding is ever computed. The rows run through a ContinuousBatcher, so every pass reads
// the weights once for all unfinished rows.
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include <diffusion_gemma/core/status.hpp>
#include <diffusion_gemma/runtime/batcher.hpp>
#include <diffusion_gemma/runtime/sequence.hpp>

namespace diffusion_gemma {

struct BatchGenerateOptions {
  int max_batch = 0;                  // rows per pass; 0: all rows in one batch
  std::int32_t left_pad_token_id = 0;  // fills the prompts' left padding in `sequences`
};

struct BatchResult {
  std::vector<GenerationResult> rows;                // per row: what Decoder::generate returns for it
  std::vector<std::vector<std::int32_t>> sequences;  // transformers' layout (see above)
};

template <class Engine_, class Sampler_ = ReferenceSampler, class Scheduler_ = CanvasScheduler<>>
class BatchDecoder {
  static_assert(check_batched_engine<Engine_>(), "see runtime/engine_traits.hpp");
  static_assert(check_decoder_policies<Sampler_, Scheduler_>(), "see docs/policies.md");

 public:
  using Engine = Engine_;
  using Sampler = Sampler_;
  using Scheduler = Scheduler_;
  using Options = DecodeOptions<Sampler, Scheduler>;

  template <class... EngineArgs>
  explicit BatchDecoder(EngineArgs&&... args) : engine_(std::forward<EngineArgs>(args)...) {}

  Engine& engine() { return engine_; }

  static Options default_options(const GenerationConfig& g) { return default_decode_options<Sampler, Scheduler>(g); }

  // One Options per row (each with its own seed or recorded draws). Every row is checked before
  // any model work.
  BatchResult generate(const std::vector<std::vector<std::int32_t>>& prompts, const std::vector<Options>& options,
                       const BatchGenerateOptions& batch = {}) {
    if (options.size() != prompts.size()) {
      throw_error(StatusCode::kInvalidArgument, "BatchDecoder::generate: ", prompts.size(), " prompts but ",
                  options.size(), " options");
    }
    // transformers measures max_length from the left-padded prompts, so a shorter row's own limit is
    // lower by its padding.
    std::size_t longest = 0;
    for (const auto& p : prompts) longest = std::max(longest, p.size());
    std::vector<Options> rows = options;
    for (std::size_t i = 0; i < prompts.size(); ++i) {
      // Without PAD, transformers keeps generating real tokens in a row that has stopped until every
      // row has, so a row that can stop early (a stop id, a shorter budget) would depend on the
      // others; with one row, or rows that all run the same canvases, nothing is filled with PAD.
      // (The user's max_length, not the padding-adjusted one: equal limits give every row the same
      // number of new tokens.)
      const auto& mine = options[i].scheduler;
      const auto& first = options[0].scheduler;
      const bool can_end_early = !mine.stop_token_ids.empty() || mine.max_new_tokens != first.max_new_tokens ||
                                 mine.max_length != first.max_length;
      if (mine.pad_token_id == kNoPadToken && prompts.size() > 1 && can_end_early) {
        throw_error(StatusCode::kInvalidArgument, "BatchDecoder::generate: row ", i,
                    " has no pad_token_id but can end before the others (stop ids, or max_new_tokens ",
                    mine.max_new_tokens, " / max_length ", mine.max_length, " against row 0's ", first.max_new_tokens,
                    " / ", first.max_length,
                    "); a batch needs one (transformers' batched generate without it keeps generating the rows that "
                    "stopped)");
      }
      int& max_length = rows[i].scheduler.max_length;
      // At least 1: 0 would mean unset. A limit the padding already reaches stops after one canvas
      // (or, as the budget, is refused by the plan), as in transformers.
      if (max_length > 0) max_length = std::max(1, max_length - static_cast<int>(longest - prompts[i].size()));
    }
    for (std::size_t i = 0; i < prompts.size(); ++i) {  // plan every row first: fail before any work
      const auto& asked = options[i].scheduler;
      if (asked.max_length > 0 && asked.max_new_tokens == GenerationConfig::kDefaultMaxNewTokens &&
          static_cast<std::size_t>(asked.max_length) <= longest) {
        throw_error(StatusCode::kInvalidArgument, "BatchDecoder::generate: row ", i, ": max_length ", asked.max_length,
                    " leaves no new token after the batch's longest prompt of ", longest,
                    " tokens (transformers measures max_length from the left-padded prompts)");
      }
      try {
        Sequence<Engine, Sampler, Scheduler> check(engine_, prompts[i], rows[i]);
        (void)check;
      } catch (const Error& e) {
        throw Error(e.code(), "BatchDecoder::generate: row " + std::to_string(i) + ": " + e.what());
      }
    }
    typename ContinuousBatcher<Engine, Sampler, Scheduler>::Limits limits;
    limits.max_batch = batch.max_batch > 0 ? batch.max_batch : std::max<int>(1, static_cast<int>(prompts.size()));
    limits.max_queue = prompts.size() + 1;
    ContinuousBatcher<Engine, Sampler, Scheduler> batcher(engine_, limits);
    BatchResult out;
    out.rows.resize(prompts.size());
    std::vector<Status> status(prompts.size());
    for (std::size_t i = 0; i < prompts.size(); ++i) {
      typename ContinuousBatcher<Engine, Sampler, Scheduler>::Request r;
      r.prompt = prompts[i];
      r.options = rows[i];
      r.on_done = [&out, &status, i](const GenerationResult& g, const Status& st) {
        out.rows[i] = g;
        status[i] = st;
      };
      batcher.submit(std::move(r));
    }
    while (batcher.step()) {
    }
    for (std::size_t i = 0; i < prompts.size(); ++i) {
      if (!status[i].ok()) throw_error(status[i].code(), "batch row ", i, ": ", status[i].message());
    }
    out.sequences = layout(prompts, options, out.rows, batch.left_pad_token_id);  // after every row succeeded
    return out;
  }

 private:
  std::vector<std::vector<std::int32_t>> layout(const std::vector<std::vector<std::int32_t>>& prompts,
                                                const std::vector<Options>& options,
                                                const std::vector<GenerationResult>& rows,
                                                std::int32_t left_pad) const {
    std::size_t longest = 0, canvases = 0;
    for (const auto& p : prompts) longest = std::max(longest, p.size());
    for (const auto& r : rows) canvases = std::max(canvases, r.canvases.size());
    std::vector<std::vector<std::int32_t>> seqs(prompts.size());
    for (std::size_t i = 0; i < prompts.size(); ++i) {
      auto& s = seqs[i];
      s.assign(longest - prompts[i].size(), left_pad);
      s.insert(s.end(), prompts[i].begin(), prompts[i].end());
      s.insert(s.end(), rows[i].tokens.begin(), rows[i].tokens.end());
      for (std::size_t b = rows[i].canvases.size(); b < canvases; ++b) {
        if (options[i].scheduler.pad_token_id == kNoPadToken) {  // the checks in generate() rule this out
          throw_error(StatusCode::kInternal, "BatchDecoder::generate: row ", i, " ended early and has no pad_token_id");
        }
        const int C = Scheduler::Blocks::canvas_length(engine_.config(), static_cast<int>(b));
        s.insert(s.end(), static_cast<std::size_t>(C), options[i].scheduler.pad_token_id);
      }
    }
    return seqs;
  }

  Engine engine_;
};

}  // namespace diffusion_gemma
