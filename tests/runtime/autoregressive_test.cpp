// SPDX-License-Identifier: Apache-2.0
// Autoregressive decoding through the KV cache equals recomputing the whole sequence: token t is
// the argmax of the encoder logits at the last position of prompt + tokens[:t].
#include <algorithm>
#include <vector>

#include <diffusion_gemma/cpu/engine.hpp>
#include <diffusion_gemma/runtime/autoregressive.hpp>

#include "support/catch.hpp"
#include "support/paths.hpp"

using namespace diffusion_gemma;
using Engine = cpu::Engine<DiffusionGemmaBackbone>;

TEST_CASE("autoregressive decoding through the cache equals full recomputation", "[runtime][ar]") {
  auto model = cpu::Model::load(dg_test::fixture("dg_small"));
  cpu::EngineOptions exact;
  exact.precision = cpu::Precision::kExact;
  AutoregressiveDecoder<Engine> ar(model, exact);
  AutoregressiveDecoder<Engine>::Options o;
  o.max_new_tokens = 12;  // crosses the sliding window (6) several times
  o.stop_token_ids = {};
  const std::vector<std::int32_t> prompt{2, 40, 7, 99};
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
