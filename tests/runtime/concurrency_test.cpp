// SPDX-License-Identifier: Apache-2.0
// One loaded model shared read-only by several decoders in different threads gives exactly the
// outputs of running them one by one; the same seed gives the same tokens whatever the number of
// threads per engine, in both precisions. (The ThreadSanitizer build of this test is scripts/reliability.sh.)
#include <thread>
#include <vector>

#include <diffusion_gemma/cpu/engine.hpp>
#include <diffusion_gemma/runtime/decoder.hpp>

#include "support/catch.hpp"
#include "support/paths.hpp"

using namespace diffusion_gemma;
using Engine = cpu::Engine<DiffusionGemmaBackbone>;
using TestDecoder = Decoder<Engine>;

namespace {

std::vector<std::int32_t> run(const std::shared_ptr<const cpu::Model>& model, int prompt_index, int threads,
                              cpu::Precision precision = cpu::Precision::kFast) {
  cpu::EngineOptions eo;
  eo.threads = threads;
  eo.precision = precision;
  TestDecoder d(model, eo);
  auto o = d.default_options(model->generation_config());
  o.scheduler.max_new_tokens = 3 * model->config().canvas_length;
  o.sampler.max_denoising_steps = 6;
  o.sampler.rng.seed = 1000 + static_cast<std::uint64_t>(prompt_index);
  std::vector<std::int32_t> prompt{2};
  for (int i = 0; i < 3 + prompt_index * 4; ++i) prompt.push_back((prompt_index * 31 + i * 7) % 300);
  auto r = d.generate(prompt, o);
  std::vector<std::int32_t> out = r.tokens;
  for (const auto& c : r.canvases) out.push_back(c.steps);  // steps are part of the answer
  return out;
}

}  // namespace

TEST_CASE("four decoders sharing one model in four threads match sequential runs", "[runtime][concurrency]") {
  auto model = cpu::Model::load(dg_test::fixture("dg_wide"));
  std::vector<std::vector<std::int32_t>> sequential, parallel(4);
  for (int i = 0; i < 4; ++i) sequential.push_back(run(model, i, 1));
  std::vector<std::thread> threads;
  // Two threads per engine: each decoder's thread opens regions on a team of its own.
  for (int i = 0; i < 4; ++i) threads.emplace_back([&, i] { parallel[i] = run(model, i, 2); });
  for (auto& t : threads) t.join();
  for (int i = 0; i < 4; ++i) CHECK(parallel[i] == sequential[i]);
  // Different prompts and seeds really give different outputs (the comparison can fail).
  CHECK(sequential[0] != sequential[1]);
}

TEST_CASE("the same seed gives the same tokens with 1, 2 and 4 threads, run after run", "[runtime][determinism]") {
  auto model = cpu::Model::load(dg_test::fixture("dg_wide"));
  for (cpu::Precision p : {cpu::Precision::kExact, cpu::Precision::kFast}) {
    INFO(cpu::precision_name(p));
    const auto reference = run(model, 2, 1, p);
    for (int threads : {1, 2, 4, 2}) CHECK(run(model, 2, threads, p) == reference);
  }
}

TEST_CASE("requests beyond the memory budget or the context are refused before any work", "[runtime][limits]") {
  auto model = cpu::Model::load(dg_test::fixture("dg_wide"));
  TestDecoder d(model);
  auto o = d.default_options(model->generation_config());
  o.scheduler.max_new_tokens = 24;
  o.memory_budget_bytes = 64 << 10;  // 64 KiB: not enough for this request
  const std::vector<std::int32_t> prompt{2, 3, 4};
  CHECK_THROWS_WITH(d.generate(prompt, o), Catch::Matchers::Contains("memory budget is 0.0625 MiB") &&
                                               Catch::Matchers::Contains("KV cache for 15 positions"));
  o.memory_budget_bytes = std::size_t{1} << 30;
  CHECK_NOTHROW(d.plan(3, o));
  o.scheduler.max_new_tokens = 1000;  // max_position_embeddings is 512
  CHECK_THROWS_WITH(d.plan(3, o), Catch::Matchers::Contains("beyond max_position_embeddings 512"));
  // Canvases of 12 are denoised whole: after 3 prompt tokens, 42 of them (504 tokens) fit in 512
  // positions, and the message names that figure rather than the 509 positions left.
  CHECK_THROWS_WITH(d.plan(3, o), Catch::Matchers::Contains("at most 504 new tokens fit"));
  o.scheduler.max_new_tokens = 504;
  CHECK_NOTHROW(d.plan(3, o));
  o.scheduler.max_new_tokens = 505;
  CHECK_THROWS(d.plan(3, o));
  CHECK(CanvasScheduler<>::max_new_tokens_that_fit(model->config(), 3, 1 << 30) == 504);
  CHECK(CanvasScheduler<>::max_new_tokens_that_fit(model->config(), 3, 30) == 30);
  CHECK(CanvasScheduler<>::max_new_tokens_that_fit(model->config(), 505, 100) == 0);
  o.scheduler.max_new_tokens = 0;
  CHECK_THROWS_WITH(d.plan(3, o), Catch::Matchers::Contains("max new tokens must be positive"));
  o.scheduler.max_new_tokens = 12;
  o.sampler.max_denoising_steps = 0;
  CHECK_THROWS_WITH(d.plan(3, o), Catch::Matchers::Contains("max denoising steps must be positive"));
  o.sampler.max_denoising_steps = 4;
  o.sampler.schedule.t_min = 0.9;
  CHECK_THROWS_WITH(d.plan(3, o), Catch::Matchers::Contains("t_max must be > t_min"));
  o.sampler.schedule.t_min = 0.4;
  o.sampler.acceptance.entropy_bound = -1.0;
  CHECK_THROWS_WITH(d.plan(3, o), Catch::Matchers::Contains("entropy bound must be > 0"));
  const std::vector<std::int32_t> empty;
  o.sampler.acceptance.entropy_bound = 0.1;
  CHECK_THROWS_WITH(d.generate(empty, o), Catch::Matchers::Contains("the prompt is empty"));
}

TEST_CASE("a callback can cancel; what was committed is kept", "[runtime][cancel]") {
  auto model = cpu::Model::load(dg_test::fixture("dg_wide"));
  TestDecoder d(model);
  auto o = d.default_options(model->generation_config());
  o.scheduler.max_new_tokens = 3 * model->config().canvas_length;
  o.sampler.max_denoising_steps = 5;
  const std::vector<std::int32_t> prompt{2, 3, 4};
  Callbacks cb;
  int steps_seen = 0;
  cb.on_step = [&](const StepEvent& e) {
    ++steps_seen;
    return !(e.record.canvas == 1 && e.record.step == 2);  // stop in the middle of the second canvas
  };
  const auto r = d.generate(prompt, o, cb);
  CHECK(r.finish == Finish::kCancelled);
  CHECK(steps_seen == 8);
  REQUIRE(r.canvases.size() == 2);
  CHECK(r.canvases[1].stop == CanvasStop::kCancelled);
  CHECK(r.tokens.size() == static_cast<std::size_t>(model->config().canvas_length));  // only canvas 0 committed
  // Cancelling from the commit callback ends after that canvas.
  Callbacks cb2;
  cb2.on_commit = [](const CommitEvent&) { return false; };
  const auto r2 = d.generate(prompt, o, cb2);
  CHECK(r2.finish == Finish::kCancelled);
  CHECK(r2.canvases.size() == 1);
  // Asking to stop at the last canvas's commit cancels nothing: the generation ended as it would.
  auto one = o;
  one.scheduler.max_new_tokens = model->config().canvas_length;
  const auto whole = d.generate(prompt, one);
  const auto r3 = d.generate(prompt, one, cb2);
  CHECK(r3.finish == whole.finish);
  CHECK(r3.finish != Finish::kCancelled);
  CHECK(r3.tokens == whole.tokens);
}

TEST_CASE("a callback cannot start a generation on the Decoder that runs it", "[runtime][cancel]") {
  auto model = cpu::Model::load(dg_test::fixture("dg_small"));
  TestDecoder d(model);
  auto o = d.default_options(model->generation_config());
  o.sampler.max_denoising_steps = 3;
  o.scheduler.max_new_tokens = model->config().canvas_length;
  const std::vector<std::int32_t> prompt{2, 40, 7, 99};
  const auto alone = d.generate(prompt, o);
  Callbacks cb;
  cb.on_step = [&](const StepEvent&) {
    d.generate(prompt, o);  // would overwrite the running canvas's self-conditioning state
    return true;
  };
  CHECK_THROWS_WITH(d.generate(prompt, o, cb), Catch::Matchers::Contains("called from a callback"));
  CHECK(d.generate(prompt, o).tokens == alone.tokens);  // usable again afterwards
}

TEST_CASE("a request cancelled between its canvas's last step and the commit keeps no uncommitted token",
          "[runtime][cancel]") {
  // The batcher cancels between steps, so a sequence can be cancelled with a finalised canvas
  // waiting for its causal re-encode: on_commit never showed that canvas, so the result must not
  // hold it either.
  using Seq = Sequence<Engine, ReferenceSampler, CanvasScheduler<>>;
  auto model = cpu::Model::load(dg_test::fixture("dg_small"));
  TestDecoder d(model);
  auto o = d.default_options(model->generation_config());
  o.sampler.max_denoising_steps = 4;
  o.scheduler.max_new_tokens = 3 * model->config().canvas_length;
  o.scheduler.stop_token_ids = {};
  const std::vector<std::int32_t> prompt{2, 40, 7, 99};
  Engine& engine = d.engine();
  std::vector<std::int32_t> streamed;
  Callbacks cb;
  cb.on_commit = [&](const CommitEvent& e) {
    streamed.insert(streamed.end(), e.tokens, e.tokens + e.valid_tokens);
    return true;
  };
  Seq s(engine, prompt, o, cb);
  s.start(engine);
  int commits_encoded = 0;
  while (s.work() != Seq::Work::kDone) {
    if (s.work() == Seq::Work::kEncode) {
      auto it = s.encode_item();
      if (it.n == model->config().canvas_length && ++commits_encoded == 2) {
        s.cancel();  // canvas 1 is final but not committed
        break;
      }
      engine.encode(it.ids, it.n, *it.cache);
      s.encoded();
    } else {
      auto it = s.template denoise_item<void>(nullptr);
      engine.denoise_step(it.canvas, it.n, it.first_step, *it.cache, it.args, *it.stats);
      s.denoised();
    }
  }
  const GenerationResult r = s.take_result();
  CHECK(r.finish == Finish::kCancelled);
  REQUIRE(r.canvases.size() == 2);
  CHECK(r.canvases[1].stop == CanvasStop::kCancelled);
  CHECK(r.tokens.size() == static_cast<std::size_t>(model->config().canvas_length));
  CHECK(r.text_tokens() == streamed);
}
