// SPDX-License-Identifier: Apache-2.0
// The `settings` object of a replay fixture (tools/reference/make_fixtures.py,
// make_batched_fixtures.py) applied to Decoder / BatchDecoder options: the one place that maps
// transformers' generate() arguments onto ours for the replay tests.
#pragma once

#include <vector>

#include <nlohmann/json.hpp>

#include <diffusion_gemma/model/config.hpp>

namespace dg_test {

template <class Options>
void apply_replay_settings(const nlohmann::json& s, Options& o) {
  o.scheduler.max_new_tokens = s.at("max_new_tokens").get<int>();
  o.sampler.max_denoising_steps = s.at("max_denoising_steps").get<int>();
  o.sampler.schedule.t_min = s.at("t_min").get<double>();
  o.sampler.schedule.t_max = s.at("t_max").get<double>();
  o.sampler.stopping.stability_threshold = s.at("stability_threshold").get<int>();
  o.sampler.stopping.confidence_threshold = s.at("confidence_threshold").get<double>();
  o.sampler.acceptance.entropy_bound = s.at("sampler_config").at("entropy_bound").get<double>();
  // transformers' None: no stop ids, no PAD, no max_length.
  o.scheduler.stop_token_ids = s.at("eos_token_id").is_null() ? std::vector<int>{} : s.at("eos_token_id").get<std::vector<int>>();
  o.scheduler.pad_token_id = s.at("pad_token_id").is_null() ? diffusion_gemma::kNoPadToken : s.at("pad_token_id").get<int>();
  o.scheduler.max_length = s.contains("max_length") && !s.at("max_length").is_null() ? s.at("max_length").get<int>() : 0;
}

}  // namespace dg_test
