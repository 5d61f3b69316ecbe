// SPDX-License-Identifier: Apache-2.0
// Autoregressive decoding on the same backbone: the encoder with its KV cache, one token per
// pass, the next token from the streaming vocabulary pass (greedy, or sampled at a temperature).
// It is the baseline that block diffusion is measured against (benchmarks/cpu).
#pragma once

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <utility>
#include <vector>

#include <diffusion_gemma/core/status.hpp>
#include <diffusion_gemma/model/config.hpp>
#include <diffusion_gemma/model/input_checks.hpp>
#include <diffusion_gemma/runtime/engine_traits.hpp>
#include <diffusion_gemma/runtime/trace.hpp>
#include <diffusion_gemma/sampler/vocab_stats.hpp>

namespace diffusion_gemma {

template <class Engine_>
class AutoregressiveDecoder {
  static_assert(check_autoregressive_engine<Engine_>(), "see runtime/engine_traits.hpp");

 public:
  using Engine = Engine_;

  struct Options {
    int max_new_tokens = 256;
    float temperature = 0.0f;  // 0: greedy
    std::uint64_t seed = 0;
    std::vector<int> stop_token_ids{1, 106, 50};
  };

  template <class... EngineArgs>
  explicit AutoregressiveDecoder(EngineArgs&&... args) : engine_(std::forward<EngineArgs>(args)...) {}

  Engine& engine() { return engine_; }

  GenerationResult generate(const std::vector<std::int32_t>& prompt, const Options& o) {
    using clock = std::chrono::steady_clock;
    const auto t0 = clock::now();
    const ModelConfig& cfg = engine_.config();
    const std::int64_t P = static_cast<std::int64_t>(prompt.size());
    if (o.max_new_tokens <= 0) throw_error(StatusCode::kInvalidArgument, "max new tokens must be positive");
    if (P <= 0) throw_error(StatusCode::kInvalidArgument, "the prompt is empty");
    if (!(o.temperature >= 0.0f) || !std::isfinite(o.temperature)) {
      throw_error(StatusCode::kInvalidArgument, "temperature must be finite and >= 0 (0: greedy), got ", o.temperature);
    }
    check_token_ids(cfg, prompt.data(), P, "prompt");
    // The last new token is returned, never encoded: positions run to P + max_new_tokens - 2.
    const std::int64_t encoded = P + o.max_new_tokens - 1;
    if (encoded > cfg.max_position_embeddings) {
      throw_error(StatusCode::kOutOfRange, "prompt ", P, " + ", o.max_new_tokens, " new tokens need ", encoded,
                  " positions, more than max_position_embeddings ", cfg.max_position_embeddings);
    }
    auto cache = engine_.make_cache(encoded);
    std::vector<float> hidden(static_cast<std::size_t>(P * cfg.hidden_size));
    engine_.encode(prompt.data(), P, cache, hidden.data());
    GenerationResult r;
    r.prefill_seconds = std::chrono::duration<double>(clock::now() - t0).count();
    const float* last = hidden.data() + (P - 1) * cfg.hidden_size;
    VocabPassResult stats;
    std::vector<float> h(static_cast<std::size_t>(cfg.hidden_size));
    std::copy(last, last + cfg.hidden_size, h.begin());
    for (int t = 0; t < o.max_new_tokens; ++t) {
      VocabPassArgs va;
      va.temperature = o.temperature > 0.0f ? o.temperature : 1.0f;
      va.soft_embedding = false;
      va.sample = o.temperature > 0.0f;
      va.key = DrawKey{o.seed, 0, static_cast<std::uint32_t>(t)};
      engine_.vocab_pass(h.data(), 1, va, stats);
      const std::int32_t next = va.sample ? stats.sample[0] : stats.argmax[0];
      r.tokens.push_back(next);
      if (r.forwards == 0) r.first_commit_seconds = std::chrono::duration<double>(clock::now() - t0).count();
      ++r.forwards;
      if (std::find(o.stop_token_ids.begin(), o.stop_token_ids.end(), next) != o.stop_token_ids.end()) {
        r.finish = Finish::kStopToken;
        break;
      }
      if (t + 1 < o.max_new_tokens) engine_.encode(&next, 1, cache, h.data());
    }
    r.seconds = std::chrono::duration<double>(clock::now() - t0).count();
    r.tokens_per_forward = r.forwards ? static_cast<double>(r.tokens.size()) / r.forwards : 0.0;
    return r;
  }

 private:
  Engine engine_;
};

}  // namespace diffusion_gemma
