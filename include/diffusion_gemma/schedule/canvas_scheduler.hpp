// SPDX-License-Identifier: Apache-2.0
// CanvasScheduler<Blocks>: which tokens are generated when. Block diffusion commits one canvas at
// a time: max_new_tokens becomes ceil(max_new_tokens / C) canvases (the output may exceed it by up
// to C - 1 tokens, as in transformers); a canvas containing a stop id ends the sequence (the stop
// id is kept, everything after it becomes PAD unless there is no PAD) and is not encoded into the
// cache, nor is the last canvas. max_length, when set, bounds prompt plus output as transformers'
// generate does (docs/sampler.md §1.1).
#pragma once

#include <algorithm>
#include <cstdint>
#include <type_traits>
#include <vector>

#include <diffusion_gemma/core/status.hpp>
#include <diffusion_gemma/model/config.hpp>

namespace diffusion_gemma {

// Every canvas has the checkpoint's canvas_length.
struct FixedBlocks {
  static int canvas_length(const ModelConfig& cfg, int /*canvas_index*/) { return cfg.canvas_length; }
};

template <class B, class = void>
struct is_blocks_policy : std::false_type {};
template <class B>
struct is_blocks_policy<B, std::void_t<decltype(int{B::canvas_length(std::declval<const ModelConfig&>(), 0)})>>
    : std::true_type {};

template <class Blocks_ = FixedBlocks>
class CanvasScheduler;

// Whether S is a CanvasScheduler<Blocks>: what Decoder, BatchDecoder and ContinuousBatcher take.
template <class S>
struct is_canvas_scheduler : std::false_type {};
template <class B>
struct is_canvas_scheduler<CanvasScheduler<B>> : std::true_type {};

template <class Blocks_>
class CanvasScheduler {
  static_assert(is_blocks_policy<Blocks_>::value,
                "CanvasScheduler<Blocks>: Blocks must provide static int canvas_length(const ModelConfig&, int canvas_index)");

 public:
  using Blocks = Blocks_;

  // The defaults are the released checkpoint's; a checkpoint's own generation_config.json is applied
  // with apply_generation_config_to_scheduler().
  struct Arguments {
    int max_new_tokens = GenerationConfig::kDefaultMaxNewTokens;
    std::vector<int> stop_token_ids{1, 106, 50};
    int pad_token_id = 0;  // kNoPadToken: tokens after a stop id are kept
    int max_length = 0;    // prompt plus output; 0: unset
  };

  struct Plan {
    int num_canvases = 0;
    std::int64_t prompt_length = 0;
    std::int64_t cache_capacity = 0;  // positions the KV cache must hold (the last canvas is never encoded)
    std::int64_t last_position = 0;   // largest position any pass uses
  };

  static Status can_implement(const Arguments& a) {
    if (a.max_new_tokens <= 0) {
      return make_status(StatusCode::kInvalidArgument, "max new tokens must be positive (got ", a.max_new_tokens, ")");
    }
    if (a.max_length < 0) return make_status(StatusCode::kInvalidArgument, "max_length must be positive (got ", a.max_length, ")");
    return {};
  }

  static Plan plan(const Arguments& a, const ModelConfig& cfg, std::int64_t prompt_length) {
    throw_if_error(can_implement(a));
    if (prompt_length <= 0) throw_error(StatusCode::kInvalidArgument, "the prompt is empty");
    if (a.pad_token_id != kNoPadToken && (a.pad_token_id < 0 || a.pad_token_id >= cfg.vocab_size)) {
      // PAD fills a canvas after its stop id and is then committed, so it is embedded.
      throw_error(StatusCode::kInvalidArgument, "pad_token_id ", a.pad_token_id, " is outside the vocabulary [0, ",
                  cfg.vocab_size, ")");
    }
    // transformers: max_length replaces a max_new_tokens left at its default, and otherwise stops
    // the generation after the first canvas that reaches it.
    std::int64_t budget = a.max_new_tokens;
    if (a.max_length > 0 && a.max_new_tokens == GenerationConfig::kDefaultMaxNewTokens) {
      budget = a.max_length - prompt_length;
      if (budget <= 0) {
        throw_error(StatusCode::kInvalidArgument, "max_length ", a.max_length, " leaves no new token after a prompt of ",
                    prompt_length, " tokens");
      }
    }
    Plan p;
    p.prompt_length = prompt_length;
    std::int64_t tokens = 0, end = prompt_length;
    while (tokens < budget && !(a.max_length > 0 && p.num_canvases > 0 && end >= a.max_length)) {
      const int c = Blocks::canvas_length(cfg, p.num_canvases);
      if (c <= 0) throw_error(StatusCode::kInvalidArgument, "canvas length must be positive (got ", c, ")");
      tokens += c;
      end += c;
      ++p.num_canvases;
      if (end > cfg.max_position_embeddings) break;  // refused below; no need to count further
    }
    p.last_position = end - 1;
    p.cache_capacity = end - Blocks::canvas_length(cfg, p.num_canvases - 1);
    const int first = Blocks::canvas_length(cfg, 0);
    if (prompt_length + first > cfg.max_position_embeddings) {
      throw_error(StatusCode::kOutOfRange, "a prompt of ", prompt_length, " tokens leaves no room for a canvas of ", first,
                  " before max_position_embeddings ", cfg.max_position_embeddings);
    }
    if (end > cfg.max_position_embeddings) {
      throw_error(StatusCode::kOutOfRange, budget == a.max_new_tokens ? "max_new_tokens " : "max_length's budget of ",
                  budget, " after a prompt of ", prompt_length,
                  " tokens needs positions beyond max_position_embeddings ", cfg.max_position_embeddings,
                  "; at most ",
                  max_new_tokens_that_fit(cfg, prompt_length, static_cast<int>(budget)), " new tokens fit (whole canvases)");
    }
    return p;
  }

  // The largest max_new_tokens that plan() accepts after this prompt, counted up to `limit`:
  // canvases are denoised whole, so it is the sum of the whole canvases that fit before
  // max_position_embeddings (0 when not even the first one fits).
  static int max_new_tokens_that_fit(const ModelConfig& cfg, std::int64_t prompt_length, int limit) {
    std::int64_t tokens = 0, end = prompt_length;
    for (int i = 0; tokens < limit; ++i) {
      const int c = Blocks::canvas_length(cfg, i);
      if (c <= 0 || end + c > cfg.max_position_embeddings) break;
      tokens += c;
      end += c;
    }
    return static_cast<int>(tokens < limit ? tokens : limit);
  }

  // Applies the stop ids to a committed canvas in place: tokens after the first stop id become
  // PAD (or stay, without a PAD). Returns the number of tokens up to and including the stop id (or
  // all), and whether one was found (the sequence is then finished).
  static std::pair<int, bool> finalize(const Arguments& a, std::int32_t* tokens, int length) {
    for (int i = 0; i < length; ++i) {
      if (std::find(a.stop_token_ids.begin(), a.stop_token_ids.end(), tokens[i]) != a.stop_token_ids.end()) {
        if (a.pad_token_id != kNoPadToken) std::fill(tokens + i + 1, tokens + length, a.pad_token_id);
        return {i + 1, true};
      }
    }
    return {length, false};
  }
};

template <class S>
void apply_generation_config_to_scheduler(const GenerationConfig& g, typename S::Arguments& a) {
  a.max_new_tokens = g.max_new_tokens;
  a.stop_token_ids = g.stop_token_ids;
  a.pad_token_id = g.pad_token_id;
  a.max_length = g.max_length;
}

}  // namespace diffusion_gemma
