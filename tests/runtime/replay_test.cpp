// SPDX-License-Identifier: Apache-2.0
// Replay parity with transformers: feed the draws that transformers' generate() made (canvas init,
// multinomial samples, renoise tokens; recorded by tools/reference/make_fixtures.py) to our
// Decoder and require exactly the same tokens, the same number of steps per canvas and the same
// stop reasons. Every decision in between (argmax, entropies, entropy-bound acceptance, stability,
// confidence, commit, stop ids, PAD fill, re-encoding) is ours.
#include <cstdio>
#include <fstream>
#include <limits>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include <diffusion_gemma/cpu/engine.hpp>
#include <diffusion_gemma/io/draws.hpp>
#include <diffusion_gemma/runtime/decoder.hpp>

#include "support/catch.hpp"
#include "support/edited_checkpoint.hpp"
#include "support/paths.hpp"
#include "support/replay_settings.hpp"

using namespace diffusion_gemma;
using ReplayDecoder = Decoder<cpu::Engine<DiffusionGemmaBackbone>, ReplaySampler>;

namespace {

struct Expected {
  std::vector<std::int32_t> tokens;
  std::vector<int> steps;
  std::vector<std::string> stop;
  ReplayDecoder::Options options;
};

Expected read_expected(const std::string& path, const GenerationConfig& defaults) {
  std::ifstream in(path);
  REQUIRE(in.good());
  const auto j = nlohmann::json::parse(in);
  Expected e;
  e.tokens = j.at("tokens").get<std::vector<std::int32_t>>();
  e.steps = j.at("steps").get<std::vector<int>>();
  e.stop = j.at("stop").get<std::vector<std::string>>();
  e.options = ReplayDecoder::default_options(defaults);
  dg_test::apply_replay_settings(j.at("settings"), e.options);
  return e;
}

// Replay parity is the exact precision's contract (fp32 activations, like transformers' fp32 run).
cpu::EngineOptions exact() {
  cpu::EngineOptions o;
  o.precision = cpu::Precision::kExact;
  return o;
}

void check_replay(const std::string& checkpoint, const std::string& run) {
  auto model = cpu::Model::load(dg_test::fixture(checkpoint));
  ReplayDecoder decoder(model, exact());
  const std::string base = dg_test::fixture(checkpoint + "/replay/" + run);
  const auto draws = io::load_draws(base + ".draws.safetensors");
  Expected e = read_expected(base + ".json", model->generation_config());
  e.options.sampler.rng.draws = draws.draws;
  const GenerationResult r = decoder.generate(draws.prompt_ids, e.options);
  INFO(checkpoint << "/" << run);
  std::vector<int> steps;
  std::vector<std::string> stop;
  for (const auto& c : r.canvases) {
    steps.push_back(c.steps);
    stop.push_back(to_string(c.stop));
  }
  CHECK(steps == e.steps);
  CHECK(stop == e.stop);
  CHECK(r.tokens == e.tokens);
}

}  // namespace

TEST_CASE("replay parity on the plain checkpoints: several canvases, long prompt, wide bound, stop id",
          "[runtime][replay][golden]") {
  for (const char* ckpt : {"dg_small", "dg_wide"}) {
    for (const char* run : {"default_short", "long_prompt", "wide_bound", "stop_id"}) check_replay(ckpt, run);
  }
}

// The generation-config keys whose absence changes the output (make_fixtures.py,
// generation_config_runs): without pad_token_id the tokens after a stop id stay; without
// eos_token_id nothing stops; max_length sets the budget (max_new_tokens at its default 256) or
// stops after the canvas that reaches it.
TEST_CASE("replay parity without PAD or stop ids and with max_length", "[runtime][replay][golden]") {
  for (const char* run : {"no_pad", "no_eos", "max_length_budget", "max_length_stop"}) check_replay("dg_small", run);
}

// The same runs with their settings read the way a checkpoint's are: written as
// generation_config.json (transformers' None is an absent key) and loaded by cpu::Model::load.
TEST_CASE("generation_config.json without PAD, without stop ids or with max_length replays transformers",
          "[runtime][replay][golden]") {
  for (const std::string run : {"no_pad", "no_eos", "max_length_budget", "max_length_stop"}) {
    INFO(run);
    const std::string base = dg_test::fixture("dg_small/replay/" + run);
    std::ifstream in(base + ".json");
    const auto j = nlohmann::json::parse(in);
    nlohmann::json settings = j.at("settings");
    for (const char* key : {"pad_token_id", "eos_token_id", "max_length"}) {
      if (settings.contains(key) && settings[key].is_null()) settings.erase(key);
    }
    const dg_test::EditedCheckpoint e("generation_config_" + run, {}, {}, {});
    std::ofstream(e.dir + "/generation_config.json") << settings.dump();
    auto model = cpu::Model::load(e.dir);
    const GenerationConfig& g = model->generation_config();
    CHECK(g.pad_token_id == (j["settings"]["pad_token_id"].is_null() ? kNoPadToken : 0));
    CHECK((g.stop_token_ids.empty() && g.ignored_stop_token_ids.empty()) == j["settings"]["eos_token_id"].is_null());
    ReplayDecoder decoder(model, exact());
    auto options = ReplayDecoder::default_options(g);
    const auto draws = io::load_draws(base + ".draws.safetensors");
    options.sampler.rng.draws = draws.draws;
    const GenerationResult r = decoder.generate(draws.prompt_ids, options);
    CHECK(r.tokens == j.at("tokens").get<std::vector<std::int32_t>>());
    CHECK(r.canvases.size() == j.at("steps").size());
  }
  // Without generation_config.json transformers has no stop id and no PAD either.
  const dg_test::EditedCheckpoint none("no_generation_config", {}, {}, {});
  std::remove((none.dir + "/generation_config.json").c_str());
  const GenerationConfig g = cpu::Model::load(none.dir)->generation_config();
  CHECK(g.stop_token_ids.empty());
  CHECK(g.pad_token_id == kNoPadToken);
  CHECK(g.max_length == 0);
}

TEST_CASE("replay parity where the stable-and-confident stop fires", "[runtime][replay][golden]") {
  for (const char* ckpt : {"dg_small_confident", "dg_wide_confident"}) {
    for (const char* run : {"converge", "converge_long_prompt", "converge_stab2", "stab0_bound"}) check_replay(ckpt, run);
  }
}

TEST_CASE("running out of recorded draws names the canvas and step", "[runtime][replay]") {
  auto model = cpu::Model::load(dg_test::fixture("dg_small"));
  ReplayDecoder decoder(model, exact());
  const std::string base = dg_test::fixture("dg_small/replay/default_short");
  const auto draws = io::load_draws(base + ".draws.safetensors");
  Expected e = read_expected(base + ".json", model->generation_config());
  e.options.sampler.rng.draws = draws.draws;
  e.options.sampler.max_denoising_steps = 11;  // one more step than was recorded
  e.options.sampler.stopping.confidence_threshold = 1e-12;
  CHECK_THROWS_WITH(decoder.generate(draws.prompt_ids, e.options),
                    Catch::Matchers::Contains("ran out of recorded draws at canvas 0, step 10"));
}

TEST_CASE("non-finite activations stop a generation with a message, not with arbitrary tokens", "[runtime]") {
  // One NaN in a norm weight of the first layer: every activation after it is NaN, in both
  // precisions (with a NaN router probability among them, which must still pick real experts).
  std::vector<float> norm(48, 1.0f);
  norm[5] = std::numeric_limits<float>::quiet_NaN();
  const dg_test::EditedCheckpoint e("nan_activations", {{"model.decoder.layers.0.input_layernorm.weight", norm}}, {}, {});
  auto model = cpu::Model::load(e.dir);
  for (const cpu::Precision precision : {cpu::Precision::kExact, cpu::Precision::kFast}) {
    cpu::EngineOptions eo;
    eo.precision = precision;
    eo.threads = 1;
    Decoder<cpu::Engine<DiffusionGemmaBackbone>> decoder(model, eo);
    auto o = Decoder<cpu::Engine<DiffusionGemmaBackbone>>::default_options(model->generation_config());
    o.scheduler.max_new_tokens = 16;
    CHECK_THROWS_WITH(decoder.generate({2, 10, 11, 12}, o),
                      Catch::Matchers::Contains("non-finite logits at canvas 0, step 0") &&
                          Catch::Matchers::Contains("--check-weights"));
  }
  // Sound weights, but temperatures so small that logits / T overflows fp32: the message says so.
  auto sound = cpu::Model::load(dg_test::fixture("dg_small"));
  cpu::EngineOptions eo;
  eo.threads = 1;
  Decoder<cpu::Engine<DiffusionGemmaBackbone>> decoder(sound, eo);
  auto o = Decoder<cpu::Engine<DiffusionGemmaBackbone>>::default_options(sound->generation_config());
  o.scheduler.max_new_tokens = 8;
  o.sampler.schedule.t_min = 1e-40;
  o.sampler.schedule.t_max = 1e-39;
  CHECK_THROWS_WITH(decoder.generate({2, 10, 11, 12}, o), Catch::Matchers::Contains("non-finite logits") &&
                                                              Catch::Matchers::Contains("temperature is too small"));
}

TEST_CASE("token ids outside the vocabulary are refused before anything reads the embedding table", "[runtime]") {
  auto model = cpu::Model::load(dg_test::fixture("dg_small"));
  const std::int32_t V = static_cast<std::int32_t>(model->config().vocab_size);
  using D = Decoder<cpu::Engine<DiffusionGemmaBackbone>>;
  cpu::EngineOptions eo;
  eo.threads = 1;
  D decoder(model, eo);
  auto o = D::default_options(model->generation_config());
  o.scheduler.max_new_tokens = 8;
  CHECK_THROWS_WITH(decoder.generate({2, V}, o), Catch::Matchers::Contains("prompt: token id " + std::to_string(V) +
                                                                           " at position 1 is outside the vocabulary"));
  CHECK_THROWS_WITH(decoder.generate({-1, 2}, o), Catch::Matchers::Contains("token id -1 at position 0"));
  // PAD fills a canvas after its stop id and is committed with it.
  auto bad_pad = o;
  bad_pad.scheduler.pad_token_id = V;
  CHECK_THROWS_WITH(decoder.generate({2, 5}, bad_pad), Catch::Matchers::Contains("pad_token_id " + std::to_string(V)));
  // The engine itself, for callers that drive it directly.
  cpu::Engine<DiffusionGemmaBackbone> engine(model, eo);
  auto cache = engine.make_cache(4);
  const std::vector<std::int32_t> ids{2, 5, V + 1000};
  CHECK_THROWS_WITH(engine.encode(ids.data(), 3, cache), Catch::Matchers::Contains("encoder input: token id " + std::to_string(V + 1000)));
  // A generation_config.json from another model is refused at load, naming the file.
  const dg_test::EditedCheckpoint e("pad_outside_vocab", {}, {}, {});
  std::ofstream(e.dir + "/generation_config.json") << R"({"eos_token_id": [1], "pad_token_id": 262143})";
  CHECK_THROWS_WITH(cpu::Model::load(e.dir), Catch::Matchers::Contains("generation_config.json: pad_token_id 262143 is "
                                                                       "outside the vocabulary"));
  // Stop ids outside the vocabulary are dropped at load, not refused (they can never be sampled).
  const dg_test::EditedCheckpoint s("stop_outside_vocab", {}, {}, {});
  std::ofstream(s.dir + "/generation_config.json") << R"({"eos_token_id": [1, 106, )" << V << "]}";
  const auto loaded = cpu::Model::load(s.dir);
  CHECK(loaded->generation_config().stop_token_ids == std::vector<int>{1, 106});
  CHECK(loaded->generation_config().ignored_stop_token_ids == std::vector<int>{static_cast<int>(V)});
}
