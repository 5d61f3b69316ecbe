// SPDX-License-Identifier: Apache-2.0
// The real-scale scenario (realscale.hpp) as one template over the Engine, so that the CPU
// reference and the GPU check make exactly the same calls. Included by realscale_host.cpp
// (cpu::Engine) and realscale.cu (cuda::Engine); needs neither Eigen nor CUDA itself.
#pragma once

#include <algorithm>
#include <cstdint>
#include <utility>
#include <vector>

#include <diffusion_gemma/runtime/decoder.hpp>

#include "realscale.hpp"

namespace dg_realscale {

template <class Engine, class... EngineArgs>
Outputs run_scenario(const Scenario& s, const diffusion_gemma::ModelConfig& cfg,
                     const std::vector<std::int32_t>& reference_top, const Progress& progress,
                     EngineArgs&&... engine_args) {
  using namespace diffusion_gemma;
  Decoder<Engine> decoder(std::forward<EngineArgs>(engine_args)...);
  Engine& engine = decoder.engine();
  const int C = cfg.canvas_length;
  const std::int64_t H = cfg.hidden_size, V = cfg.vocab_size;
  const auto say = [&](const std::string& what) {
    if (progress) progress(what);
  };
  Outputs out;

  say("encoder: " + std::to_string(s.prompt) + " prompt tokens");
  const std::vector<std::int32_t> prompt = prompt_ids(s, V);
  auto cache = engine.make_cache(static_cast<std::int64_t>(prompt.size()) + C);
  std::vector<float> hidden(prompt.size() * static_cast<std::size_t>(H));
  engine.encode(prompt.data(), static_cast<std::int64_t>(prompt.size()), cache, hidden.data());
  out.prompt_last_hidden.assign(hidden.end() - H, hidden.end());

  say("denoiser pass and LM head over a canvas of " + std::to_string(C));
  const std::vector<std::int32_t> canvas = canvas_ids(s, V, 0);
  std::vector<float> den(static_cast<std::size_t>(C) * static_cast<std::size_t>(H));
  engine.denoise(canvas.data(), C, nullptr, cache, den.data());
  {
    std::vector<float> logits(static_cast<std::size_t>(C) * static_cast<std::size_t>(V));
    engine.lm_head(den.data(), C, logits.data());
    summarize_logits(logits.data(), C, V, reference_top, out);
  }

  say("two streaming denoise steps (the second self-conditioned)");
  VocabPassArgs args;
  args.temperature = 0.8f;
  args.soft_embedding = true;
  args.sample = true;
  args.key = DrawKey{s.seed, 0, 0};
  VocabPassResult stats;
  engine.denoise_step(canvas.data(), C, true, cache, args, stats);
  out.step1_argmax = stats.argmax;
  out.step1_sample = stats.sample;
  out.step1_entropy = stats.entropy;
  // The second step denoises a canvas that depends on the back-end only through the first step's
  // draws; a caller that compares two back-ends feeds both the same canvas (canvas_ids(s, V, 1)).
  const std::vector<std::int32_t> canvas2 = canvas_ids(s, V, 1);
  args.key.step = 1;
  engine.denoise_step(canvas2.data(), C, false, cache, args, stats);
  out.step2_argmax = stats.argmax;
  out.step2_entropy = stats.entropy;

  say("sampled generation: one canvas, " + std::to_string(s.generation_steps) + " steps");
  typename Decoder<Engine>::Options o = Decoder<Engine>::default_options(GenerationConfig{});
  o.sampler.max_denoising_steps = s.generation_steps;
  o.sampler.rng.seed = s.seed;
  o.scheduler.max_new_tokens = C;
  const std::vector<std::int32_t> short_prompt(prompt.begin(), prompt.begin() + std::min<std::size_t>(
                                                                    prompt.size(), static_cast<std::size_t>(s.generation_prompt)));
  const GenerationResult g = decoder.generate(short_prompt, o);
  out.generation = g.tokens;
  out.generation_forwards = g.forwards;
  return out;
}

}  // namespace dg_realscale
