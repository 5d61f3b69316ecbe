// SPDX-License-Identifier: Apache-2.0
// Batched replay parity with transformers: tools/reference/make_batched_fixtures.py ran
// transformers' generate() on a left-padded batch (attention_mask, fp32) and recorded, per row,
// the draws of that row (sliced from the [B, C] tensors transformers drew for the whole batch, only
// for the steps the row itself ran), plus transformers' `sequences` and per row the steps and stop
// reason of every canvas, and tokens_per_forward. BatchDecoder must give the same `sequences`
// (left padding, PAD after a stop id and in every later canvas of that row), and every row the
// same steps, stops and tokens_per_forward: a row that converged early is frozen while the others
// go on, a row that produced a stop id is finished while the others go on.
#include <cmath>
#include <cstdint>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include <diffusion_gemma/cpu/engine.hpp>
#include <diffusion_gemma/io/draws.hpp>
#include <diffusion_gemma/runtime/batch_decoder.hpp>
#include <diffusion_gemma/runtime/decoder.hpp>

#include "support/catch.hpp"
#include "support/paths.hpp"
#include "support/replay_settings.hpp"

using namespace diffusion_gemma;
using ReplayEngine = cpu::Engine<DiffusionGemmaBackbone>;
using ReplayBatchDecoder = BatchDecoder<ReplayEngine, ReplaySampler>;
using ReplayDecoder = Decoder<ReplayEngine, ReplaySampler>;

namespace {

struct ExpectedRow {
  std::vector<std::int32_t> tokens;  // transformers' sequences[i] after the padded prompt
  std::vector<int> steps;
  std::vector<std::string> stop;
  int forwards = 0;
  double tokens_per_forward = 0.0;
  int finished_canvas = -1;
};

struct BatchRun {
  std::string name;
  std::vector<std::vector<std::int32_t>> prompts;
  std::vector<std::vector<std::int32_t>> sequences;
  std::int32_t left_pad_token_id = 0;
  nlohmann::json settings;
  std::vector<ExpectedRow> rows;
  std::vector<io::DrawsFile> draws;  // one per row
};

BatchRun read_run(const std::string& checkpoint, const std::string& run) {
  BatchRun r;
  r.name = checkpoint + "/" + run;
  const std::string base = dg_test::fixture(checkpoint + "/replay_batch/" + run);
  std::ifstream in(base + ".json");
  REQUIRE(in.good());
  const auto j = nlohmann::json::parse(in);
  r.prompts = j.at("prompts").get<std::vector<std::vector<std::int32_t>>>();
  r.sequences = j.at("sequences").get<std::vector<std::vector<std::int32_t>>>();
  r.left_pad_token_id = j.at("left_pad_token_id").get<std::int32_t>();
  r.settings = j.at("settings");
  for (const auto& row : j.at("rows")) {
    ExpectedRow e;
    e.tokens = row.at("tokens").get<std::vector<std::int32_t>>();
    e.steps = row.at("steps").get<std::vector<int>>();
    e.stop = row.at("stop").get<std::vector<std::string>>();
    e.forwards = row.at("forwards").get<int>();
    e.tokens_per_forward = row.at("tokens_per_forward").get<double>();
    e.finished_canvas = row.at("finished_canvas").get<int>();
    r.rows.push_back(e);
  }
  REQUIRE(r.rows.size() == r.prompts.size());
  REQUIRE(r.sequences.size() == r.prompts.size());
  for (std::size_t i = 0; i < r.prompts.size(); ++i) {
    r.draws.push_back(io::load_draws(base + ".row" + std::to_string(i) + ".draws.safetensors"));
    REQUIRE(r.draws.back().prompt_ids == r.prompts[i]);  // the draws file holds the unpadded prompt
  }
  return r;
}

// Per row, the options replay_test.cpp builds for a single run: the fixture's settings over the
// checkpoint's generation config, with that row's recorded draws.
template <class Options, class Decoder_>
std::vector<Options> row_options(const BatchRun& r, const GenerationConfig& defaults) {
  std::vector<Options> out;
  for (const auto& d : r.draws) {
    Options o = Decoder_::default_options(defaults);
    dg_test::apply_replay_settings(r.settings, o);
    o.sampler.rng.draws = d.draws;
    out.push_back(o);
  }
  return out;
}

cpu::EngineOptions exact() {
  cpu::EngineOptions o;
  o.precision = cpu::Precision::kExact;
  return o;
}

// What transformers' row gives, compared with what our decoder returned for that row.
void check_row(const BatchRun& r, std::size_t i, const GenerationResult& g) {
  const ExpectedRow& e = r.rows[i];
  INFO(r.name << " row " << i);
  std::vector<int> steps;
  std::vector<std::string> stop;
  for (const auto& c : g.canvases) {
    steps.push_back(c.steps);
    stop.push_back(to_string(c.stop));
  }
  CHECK(steps == e.steps);
  CHECK(stop == e.stop);
  CHECK(g.forwards == e.forwards);
  CHECK(std::abs(g.tokens_per_forward - e.tokens_per_forward) <= 1e-9);
  // The row's own tokens: transformers' canvases up to the one where the row finished.
  std::size_t ran = 0;
  for (const auto& c : g.canvases) ran += static_cast<std::size_t>(c.length);
  REQUIRE(ran <= e.tokens.size());
  CHECK(g.tokens == std::vector<std::int32_t>(e.tokens.begin(), e.tokens.begin() + static_cast<std::ptrdiff_t>(ran)));
  CHECK((g.finish == Finish::kStopToken) == (e.finished_canvas >= 0));
  int stopped = -1;
  for (const auto& c : g.canvases) {
    if (c.stop_token) {
      stopped = c.canvas;
      break;
    }
  }
  CHECK(stopped == e.finished_canvas);
}

void check_batch(const std::string& checkpoint, const std::string& run, int max_batch) {
  auto model = cpu::Model::load(dg_test::fixture(checkpoint));
  ReplayBatchDecoder decoder(model, exact());
  const BatchRun r = read_run(checkpoint, run);
  const auto options = row_options<ReplayBatchDecoder::Options, ReplayBatchDecoder>(r, model->generation_config());
  BatchGenerateOptions batch;
  batch.max_batch = max_batch;
  batch.left_pad_token_id = r.left_pad_token_id;
  const BatchResult out = decoder.generate(r.prompts, options, batch);
  INFO(r.name << " max_batch " << max_batch);
  REQUIRE(out.rows.size() == r.prompts.size());
  REQUIRE(out.sequences.size() == r.sequences.size());
  for (std::size_t i = 0; i < r.sequences.size(); ++i) {
    INFO("sequences row " << i);
    CHECK(out.sequences[i] == r.sequences[i]);
  }
  for (std::size_t i = 0; i < r.prompts.size(); ++i) check_row(r, i, out.rows[i]);
}

struct Fixture {
  const char* checkpoint;
  const char* run;
};
// converge_mix: rows converge after different numbers of steps (one runs to max steps);
// stop_mix: rows 1 and 3 produce stop ids in canvases 0 and 1 while rows 0 and 2 go on, the
// prompts are left-padded with a token that is not PAD; window_stop: dg_wide, prompts across the
// sliding window, row 2 stops in canvas 0.
const Fixture kRuns[] = {
    {"dg_small_confident", "converge_mix"}, {"dg_small", "stop_mix"}, {"dg_wide", "window_stop"}};

}  // namespace

TEST_CASE("batched fixtures: every row alone through Decoder gives transformers' batched result",
          "[runtime][replay][golden][batch]") {
  // The per-row semantics the batch must keep: without this, a batch failure could be the row's.
  for (const auto& f : kRuns) {
    auto model = cpu::Model::load(dg_test::fixture(f.checkpoint));
    ReplayDecoder decoder(model, exact());
    const BatchRun r = read_run(f.checkpoint, f.run);
    const auto options = row_options<ReplayDecoder::Options, ReplayDecoder>(r, model->generation_config());
    for (std::size_t i = 0; i < r.prompts.size(); ++i) check_row(r, i, decoder.generate(r.prompts[i], options[i]));
  }
}

TEST_CASE("batched replay parity with transformers: sequences, steps, stops, tokens per forward",
          "[runtime][replay][golden][batch]") {
  for (const auto& f : kRuns) check_batch(f.checkpoint, f.run, 0);
}

TEST_CASE("batched replay parity holds when the rows run in smaller batches", "[runtime][replay][golden][batch]") {
  for (const auto& f : kRuns) check_batch(f.checkpoint, f.run, 2);
}
