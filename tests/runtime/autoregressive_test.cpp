// SPDX-License-Identifier: Apache-2.0
// Autoregressive decoding through the KV cache equals recomputing the whole sequence: token t is
// the argmax of the encoder logits at the last position of prompt + tokens[:t].
#include <algorithm>
#include <limits>
#include <vector>

#include <diffusion_gemma/cpu/engine.hpp>
#include <diffusion_gemma/runtime/autoregressive.hpp>

#include "support/catch.hpp"
#include "support/paths.hpp"

using namespace diffusion_gemma;
using Engine = cpu::Engine<DiffusionGemmaBackbone>;

namespace {

cpu::EngineOptions exact_options() {
  cpu::EngineOptions exact;
  exact.precision = cpu::Precision::kExact;
  return exact;
}

// Greedy, without stop ids.
AutoregressiveDecoder<Engine>::Options greedy(int max_new_tokens) {
  AutoregressiveDecoder<Engine>::Options o;
  o.max_new_tokens = max_new_tokens;
  o.stop_token_ids = {};
  return o;
}

const std::vector<std::int32_t> kPrompt{2, 40, 7, 99};

}  // namespace

TEST_CASE("autoregressive decoding through the cache equals full recomputation", "[runtime][ar]") {
  auto model = cpu::Model::load(dg_test::fixture("dg_small"));
  const cpu::EngineOptions exact = exact_options();
  AutoregressiveDecoder<Engine> ar(model, exact);
  const auto o = greedy(12);  // crosses the sliding window (6) several times
  const std::vector<std::int32_t>& prompt = kPrompt;
  const auto r = ar.generate(prompt, o);
  REQUIRE(r.tokens.size() == 12u);

  Engine engine(model, exact);
  const std::int64_t H = model->config().hidden_size, V = model->config().vocab_size;
  std::vector<std::int32_t> seq = prompt;
  for (std::size_t t = 0; t < r.tokens.size(); ++t) {
    auto cache = engine.make_cache(static_cast<std::int64_t>(seq.size()));
    std::vector<float> hidden(seq.size() * H), logits(V);
    engine.encode(seq.data(), static_cast<std::int64_t>(seq.size()), cache, hidden.data());
    engine.lm_head(hidden.data() + (seq.size() - 1) * H, 1, logits.data());
    const auto expected = static_cast<std::int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
    CHECK(r.tokens[t] == expected);
    seq.push_back(r.tokens[t]);
  }
}

TEST_CASE("autoregressive decoding: the text, the last position, bad temperatures", "[runtime][ar]") {
  auto model = cpu::Model::load(dg_test::fixture("dg_small"));
  AutoregressiveDecoder<Engine> ar(model, exact_options());
  auto o = greedy(5);
  const std::vector<std::int32_t>& prompt = kPrompt;
  auto r = ar.generate(prompt, o);
  REQUIRE(r.tokens.size() == 5u);
  CHECK(r.text_tokens() == r.tokens);  // no canvases: the tokens are the text
  CHECK(r.first_commit_seconds > 0.0);
  // A stop id ends the text with it.
  o.stop_token_ids = {r.tokens[2]};
  const auto stopped = ar.generate(prompt, o);
  CHECK(stopped.finish == Finish::kStopToken);
  CHECK(stopped.text_tokens().back() == r.tokens[2]);

  // The last new token is never encoded, so a prompt of max_position_embeddings tokens still
  // yields one, and one more than that is refused.
  const std::int64_t mpe = model->config().max_position_embeddings;
  o.stop_token_ids = {};
  o.max_new_tokens = 1;
  std::vector<std::int32_t> full(static_cast<std::size_t>(mpe), 7);
  CHECK(ar.generate(full, o).tokens.size() == 1u);
  o.max_new_tokens = 2;
  CHECK_THROWS_WITH(ar.generate(full, o), Catch::Matchers::Contains("max_position_embeddings"));
  full.pop_back();
  CHECK(ar.generate(full, o).tokens.size() == 2u);

  o.max_new_tokens = 1;
  for (float t : {-1.0f, std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity()}) {
    o.temperature = t;
    CHECK_THROWS_WITH(ar.generate(prompt, o), Catch::Matchers::Contains("temperature"));
  }
}
