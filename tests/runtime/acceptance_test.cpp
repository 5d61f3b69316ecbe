// SPDX-License-Identifier: Apache-2.0
// The Acceptance and State slots. Entropy-bound acceptance where equal entropies meet the bound: which of several equally certain
// positions transformers accepts depends on torch.sort's (unstable) order. The rows and
// transformers' accepted masks come from tools/reference/make_acceptance_fixtures.py.
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include <diffusion_gemma/cpu/engine.hpp>
#include <diffusion_gemma/cpu/model.hpp>
#include <diffusion_gemma/io/json_file.hpp>
#include <diffusion_gemma/runtime/batch_decoder.hpp>
#include <diffusion_gemma/runtime/decoder.hpp>
#include <diffusion_gemma/sampler/acceptance.hpp>

#include "support/catch.hpp"
#include "support/paths.hpp"

using namespace diffusion_gemma;

TEST_CASE("entropy-bound acceptance breaks ties as transformers' torch.sort does", "[sampler][golden]") {
  const io::Json j = io::read_json_file(dg_test::fixture("sampler/acceptance_ties.json"));
  const auto& rows = j.at("rows");
  REQUIRE(rows.size() >= 15);
  int differs_from_lowest_position_first = 0;
  for (std::size_t r = 0; r < rows.size(); ++r) {
    const auto& row = rows[r];
    const int C = row.at("canvas_length").get<int>();
    INFO("row " << r << ", C " << C);
    std::vector<float> entropy;
    for (const auto bits : row.at("entropy_f32_bits").get<std::vector<std::uint32_t>>()) {
      float f;
      std::memcpy(&f, &bits, 4);
      entropy.push_back(f);
    }
    REQUIRE(static_cast<int>(entropy.size()) == C);
    const std::vector<std::int32_t> ids(static_cast<std::size_t>(C), 0);
    const StepView view{ids.data(), ids.data(), entropy.data(), C, 0, 10};
    EntropyBound::Arguments a;
    a.entropy_bound = row.at("entropy_bound").get<double>();
    EntropyBound::State state;
    std::vector<std::uint8_t> accepted(static_cast<std::size_t>(C));
    EntropyBound::accept(a, view, state, accepted.data());
    const auto want = row.at("accepted").get<std::vector<int>>();
    CHECK(std::vector<int>(accepted.begin(), accepted.end()) == want);
    // The rule "equal entropies: lower position first" accepts the same number of positions but
    // not always the same ones; count the rows where it would have failed.
    std::vector<int> lowest_first(static_cast<std::size_t>(C), 0);
    {
      std::vector<int> order(static_cast<std::size_t>(C));
      for (int i = 0; i < C; ++i) order[static_cast<std::size_t>(i)] = i;
      std::stable_sort(order.begin(), order.end(), [&](int x, int y) { return entropy[x] < entropy[y]; });
      double cum = 0.0;
      for (const int p : order) {
        cum += entropy[static_cast<std::size_t>(p)];
        lowest_first[static_cast<std::size_t>(p)] =
            math::entropy_bound_accepts(cum, entropy[static_cast<std::size_t>(p)], static_cast<float>(a.entropy_bound));
      }
    }
    differs_from_lowest_position_first += lowest_first != want;
  }
  // The fixture is only a test of tie order if that order matters in it.
  CHECK(differs_from_lowest_position_first > 0);
}

// ---- the Acceptance slot as a researcher's policy meets it ---------------------------------------

namespace {

// Keeps one position per step, which moves with the step: the positions it does not mark must
// arrive unaccepted, whatever the last step or canvas kept.
struct OnePositionPerStep {
  struct Arguments {};
  struct State {};
  static Status can_implement(const Arguments&) { return {}; }
  static void accept(const Arguments&, const StepView& v, State&, std::uint8_t* accepted) {
    accepted[v.step % v.length] = 1;
  }
};

// Reference policies with a new name: they take the reference Arguments, so generation_config.json
// applies to them as to the originals.
struct MyBound : EntropyBound {};
struct MySchedule : LinearTemperature {};
struct MyStop : StableAndConfident {};

// Two canvases of 8 tokens (dg_small), each through all of its 4 steps, no stop id.
template <class Options>
void run_every_step(Options& o) {
  o.sampler.max_denoising_steps = 4;
  o.scheduler.max_new_tokens = 16;
  o.scheduler.stop_token_ids.clear();
  o.sampler.stopping.confidence_threshold = 1e-30;
}

}  // namespace

TEST_CASE("an Acceptance policy sees a cleared mask every step", "[sampler][runtime]") {
  using OneSampler = Sampler<UniformState, SelfConditioning, OnePositionPerStep>;
  auto model = cpu::Model::load(dg_test::fixture("dg_small"));
  Decoder<cpu::Engine<DiffusionGemmaBackbone>, OneSampler> decoder(model);
  auto o = decltype(decoder)::default_options(model->generation_config());
  run_every_step(o);
  int steps = 0;
  Callbacks cb;
  cb.on_step = [&](const StepEvent& e) {
    int kept = 0;
    for (int i = 0; i < e.length; ++i) kept += e.accepted[i];
    INFO("canvas " << e.record.canvas << " step " << e.record.step);
    CHECK(kept == 1);
    CHECK(e.accepted[e.record.step % e.length] == 1);
    CHECK(e.record.accepted == 1);
    ++steps;
    return true;
  };
  decoder.generate({2, 5, 9}, o, cb);
  CHECK(steps == 8);  // two canvases of 8 tokens, 4 steps each
}

TEST_CASE("generation_config.json applies to policies derived from the reference ones", "[sampler]") {
  GenerationConfig g;
  g.entropy_bound = 0.7;
  g.t_min = 0.25;
  g.t_max = 0.9;
  g.stability_threshold = 3;
  g.confidence_threshold = 0.2;
  g.max_denoising_steps = 12;
  using Mine = Sampler<UniformState, SelfConditioning, MyBound, MySchedule, MyStop>;
  Mine::Arguments a;
  apply_generation_config<Mine>(g, a);
  CHECK(a.max_denoising_steps == 12);
  CHECK(a.acceptance.entropy_bound == Approx(0.7));
  CHECK(a.schedule.t_min == Approx(0.25));
  CHECK(a.schedule.t_max == Approx(0.9));
  CHECK(a.stopping.stability_threshold == 3);
  CHECK(a.stopping.confidence_threshold == Approx(0.2));
}

// What Decoder, BatchDecoder and ContinuousBatcher check of their Sampler and Scheduler, and what
// Sampler checks of its Rng, before anything else can fail less readably.
static_assert(is_sampler<ReferenceSampler>::value && is_sampler<ReplaySampler>::value, "Sampler<...> is a sampler");
static_assert(!is_sampler<EntropyBound>::value, "a policy alone is not a sampler");
static_assert(is_canvas_scheduler<CanvasScheduler<>>::value && !is_canvas_scheduler<FixedBlocks>::value,
              "a Blocks policy alone is not a scheduler");
namespace {
struct KeyAsInteger {
  struct Arguments {};
  static constexpr bool kReplaysSamples = false;
  explicit KeyAsInteger(const Arguments&) {}
  std::uint64_t key(int, int) const { return 0; }
  std::int32_t token(DrawPurpose, int, int, int, std::int64_t) const { return 0; }
};
struct ReplayWithoutSample : KeyAsInteger {
  using KeyAsInteger::KeyAsInteger;
  static constexpr bool kReplaysSamples = true;
  DrawKey key(int, int) const { return {}; }
};
}  // namespace
static_assert(!is_rng_policy<KeyAsInteger>::value, "key() must return a DrawKey");
static_assert(is_rng_policy<ReplayWithoutSample>::value && !has_replayed_sample<ReplayWithoutSample>::value &&
                  has_replayed_sample<ReplayRng>::value,
              "a replaying Rng is checked for sample()");

// ---- the State slot with options of its own ------------------------------------------------------

namespace {

// Draws every token from [first, first + count) of the vocabulary (a canvas kept among ordinary
// text ids, say), and logs what it drew: its Arguments must reach both init and renoise.
struct RangeState {
  struct Arguments {
    std::int32_t first = 0;
    std::int32_t count = 1;
    std::vector<std::int32_t>* initial = nullptr;
    std::vector<std::int32_t>* renoised = nullptr;
  };
  static Status can_implement(const Arguments& a) {
    if (a.first < 0 || a.count <= 0) return make_status(StatusCode::kInvalidArgument, "RangeState: empty range");
    return {};
  }
  template <class Rng>
  static void init(const Arguments& a, const Rng& rng, int canvas, std::int64_t, std::int32_t* out, int length) {
    for (int i = 0; i < length; ++i) {
      out[i] = a.first + rng.token(DrawPurpose::kInit, canvas, 0, i, a.count);
      if (a.initial != nullptr) a.initial->push_back(out[i]);
    }
  }
  template <class Rng>
  static std::int32_t renoise(const Arguments& a, const Rng& rng, int canvas, int step, int position, std::int64_t) {
    const std::int32_t t = a.first + rng.token(DrawPurpose::kRenoise, canvas, step, position, a.count);
    if (a.renoised != nullptr) a.renoised->push_back(t);
    return t;
  }
};

}  // namespace

static_assert(is_state_policy<RangeState>::value && is_state_policy<UniformState>::value,
              "a State policy may take its Arguments or not");
static_assert(!is_state_policy<EntropyBound>::value, "an Acceptance policy is not a State policy");

TEST_CASE("a State policy receives its Arguments in init and renoise, and can refuse them", "[sampler][runtime]") {
  using RangeSampler = Sampler<RangeState>;
  auto model = cpu::Model::load(dg_test::fixture("dg_small"));
  Decoder<cpu::Engine<DiffusionGemmaBackbone>, RangeSampler> decoder(model);
  auto o = decltype(decoder)::default_options(model->generation_config());
  run_every_step(o);
  o.sampler.acceptance.entropy_bound = 1e-30;       // keeps few positions, so most are renoised
  std::vector<std::int32_t> initial, renoised;
  o.sampler.state = RangeState::Arguments{40, 3, &initial, &renoised};
  decoder.generate({2, 5, 9}, o);
  CHECK(initial.size() == 16);  // two canvases of 8
  CHECK_FALSE(renoised.empty());
  std::vector<std::int32_t> all = initial;
  all.insert(all.end(), renoised.begin(), renoised.end());
  for (const auto t : all) {
    INFO("token " << t);
    CHECK((t >= 40 && t < 43));
  }
  CHECK(std::set<std::int32_t>(all.begin(), all.end()).size() == 3);

  o.sampler.state.count = 0;
  CHECK_FALSE(RangeSampler::can_implement(o.sampler).ok());
  CHECK_THROWS_WITH(decoder.generate({2, 5, 9}, o), Catch::Matchers::Contains("RangeState: empty range"));
}

namespace {

// A "greedy" schedule: T = 0 would divide the logits by zero.
struct ZeroTemperature {
  struct Arguments {};
  static Status can_implement(const Arguments&) { return {}; }
  static float temperature(const Arguments&, int, int) { return 0.0f; }
};

// Renoises from a draw keyed by the Rng's own key (a legal use of the Rng: a State is checked with
// the Sampler's Rng type, not a stand-in that has only token()).
struct KeyedState {
  struct Arguments {};
  template <class Rng>
  static void init(const Rng& rng, int canvas, std::int64_t vocab, std::int32_t* out, int length) {
    UniformState::init(rng, canvas, vocab, out, length);
  }
  template <class Rng>
  static auto renoise(const Rng& rng, int canvas, int step, int position, std::int64_t vocab) {
    const DrawKey k = rng.key(canvas, step);
    (void)k;
    return rng.token(DrawPurpose::kRenoise, canvas, step, position, vocab);
  }
};

}  // namespace

static_assert(is_state_policy<KeyedState, PhiloxRng>::value, "a State may call any member of the Sampler's Rng");

TEST_CASE("a Schedule's temperature must be positive and finite", "[sampler][runtime]") {
  auto model = cpu::Model::load(dg_test::fixture("dg_small"));
  Decoder<cpu::Engine<DiffusionGemmaBackbone>, Sampler<UniformState, SelfConditioning, EntropyBound, ZeroTemperature>>
      decoder(model);
  auto o = decltype(decoder)::default_options(model->generation_config());
  run_every_step(o);
  CHECK_THROWS_WITH(decoder.generate({2, 5, 9}, o),
                    Catch::Matchers::Contains("temperature at canvas 0, step 0 is 0; it must be positive and finite"));
}

TEST_CASE("a State's token outside the vocabulary ends its own request, not its batch", "[sampler][runtime]") {
  using RangeSampler = Sampler<RangeState>;
  auto model = cpu::Model::load(dg_test::fixture("dg_small"));
  cpu::EngineOptions eo;
  eo.threads = 1;
  BatchDecoder<cpu::Engine<DiffusionGemmaBackbone>, RangeSampler> batch(model, eo);
  Decoder<cpu::Engine<DiffusionGemmaBackbone>, RangeSampler> single(model, eo);
  auto good = decltype(single)::default_options(model->generation_config());
  run_every_step(good);
  good.sampler.state = RangeState::Arguments{40, 3, nullptr, nullptr};
  auto bad = good;
  bad.sampler.state.first = static_cast<std::int32_t>(model->config().vocab_size);  // can_implement cannot see V
  const std::vector<std::int32_t> prompt{2, 5, 9};
  CHECK_THROWS_WITH(single.generate(prompt, bad),
                    Catch::Matchers::Contains("the State policy's init put token id") &&
                        Catch::Matchers::Contains("outside the vocabulary [0, " +
                                                  std::to_string(model->config().vocab_size) + ")"));
  // In a batch the healthy row is not failed with it, and the failure names the bad row.
  cpu::Engine<DiffusionGemmaBackbone> engine(model, eo);
  ContinuousBatcher<cpu::Engine<DiffusionGemmaBackbone>, RangeSampler> batcher(engine, {});
  Status bad_status, good_status;
  GenerationResult good_result;
  for (int i = 0; i < 2; ++i) {
    decltype(batcher)::Request r;
    r.prompt = prompt;
    r.options = i == 0 ? bad : good;
    r.on_done = [&, i](const GenerationResult& g, const Status& st) {
      (i == 0 ? bad_status : good_status) = st;
      if (i == 1) good_result = g;
    };
    batcher.submit(std::move(r));
  }
  while (batcher.step()) {
  }
  CHECK_FALSE(bad_status.ok());
  CHECK(bad_status.message().find("outside the vocabulary") != std::string::npos);
  CHECK(good_status.ok());
  CHECK(good_result.tokens == single.generate(prompt, good).tokens);
  CHECK_THROWS_WITH(batch.generate({prompt, prompt}, {good, bad}), Catch::Matchers::Contains("row 1"));
}
