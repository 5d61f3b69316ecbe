// SPDX-License-Identifier: Apache-2.0
// Many sequences at once: a request gives the same tokens alone (Decoder) or in any batch
// composition of a ContinuousBatcher, at any thread count, in both precisions; admission follows
// the memory budget; cancellation ends a request within one step and frees its memory.
#include <map>
#include <new>
#include <stdexcept>
#include <string>
#include <vector>

#include <diffusion_gemma/cpu/engine.hpp>
#include <diffusion_gemma/runtime/batch_decoder.hpp>
#include <diffusion_gemma/runtime/batcher.hpp>
#include <diffusion_gemma/runtime/decoder.hpp>

#include "support/catch.hpp"
#include "support/paths.hpp"

using namespace diffusion_gemma;
using CpuEngine = cpu::Engine<DiffusionGemmaBackbone>;
using Batcher = ContinuousBatcher<CpuEngine>;
using Options = DecodeOptions<ReferenceSampler, CanvasScheduler<>>;

namespace {

struct Case {
  std::vector<std::int32_t> prompt;
  Options options;
};

// Five requests that differ in prompt length, seed, steps, length and stop ids.
std::vector<Case> cases(const cpu::Model& model) {
  std::vector<Case> out;
  const int C = model.config().canvas_length;
  const int V = static_cast<int>(model.config().vocab_size);
  for (int i = 0; i < 5; ++i) {
    Case c;
    c.options = Decoder<CpuEngine>::default_options(model.generation_config());
    c.options.sampler.rng.seed = 77 + 13 * static_cast<std::uint64_t>(i);
    c.options.sampler.max_denoising_steps = 4 + i;
    c.options.scheduler.max_new_tokens = (1 + i % 3) * C;
    if (i == 3) c.options.scheduler.stop_token_ids = {5, 9, 17, 33};  // likely to stop early
    c.prompt.push_back(2);
    for (int t = 0; t < 2 + 9 * i; ++t) c.prompt.push_back((i * 37 + t * 11) % (V - 3) + 3);
    out.push_back(c);
  }
  return out;
}

// What a request's answer is: its tokens and how each canvas ended.
std::vector<std::int32_t> answer(const GenerationResult& r) {
  std::vector<std::int32_t> a = r.tokens;
  for (const auto& c : r.canvases) {
    a.push_back(c.steps);
    a.push_back(static_cast<std::int32_t>(c.stop));
  }
  a.push_back(static_cast<std::int32_t>(r.finish));
  return a;
}

std::vector<std::vector<std::int32_t>> alone(const std::shared_ptr<const cpu::Model>& model, cpu::EngineOptions eo) {
  Decoder<CpuEngine> d(model, eo);
  std::vector<std::vector<std::int32_t>> out;
  for (const auto& c : cases(*model)) out.push_back(answer(d.generate(c.prompt, c.options)));
  return out;
}

// Runs every case through one batcher; `stagger`: submit a request every other step instead of all at once.
std::vector<std::vector<std::int32_t>> batched(const std::shared_ptr<const cpu::Model>& model, cpu::EngineOptions eo,
                                               int max_batch, bool stagger, int* widest = nullptr) {
  CpuEngine engine(model, eo);
  Batcher::Limits limits;
  limits.max_batch = max_batch;
  Batcher batcher(engine, limits);
  const auto cs = cases(*model);
  std::vector<std::vector<std::int32_t>> out(cs.size());
  std::vector<int> done(cs.size(), 0);
  std::size_t submitted = 0;
  const auto submit = [&](std::size_t i) {
    Batcher::Request r;
    r.prompt = cs[i].prompt;
    r.options = cs[i].options;
    r.on_done = [&, i](const GenerationResult& g, const Status& st) {
      REQUIRE(st.ok());
      out[i] = answer(g);
      ++done[i];
    };
    batcher.submit(std::move(r));
  };
  if (!stagger) {
    for (; submitted < cs.size(); ++submitted) submit(submitted);
  }
  for (int it = 0;; ++it) {
    if (stagger && submitted < cs.size() && it % 2 == 0) submit(submitted++);
    const bool worked = batcher.step();
    if (widest) *widest = std::max(*widest, batcher.stats().last_batch);
    if (!worked && submitted == cs.size()) break;
  }
  for (int d : done) CHECK(d == 1);
  return out;
}

}  // namespace

TEST_CASE("a request gives the same answer alone and in any batch, at any thread count", "[runtime][batch]") {
  auto model = cpu::Model::load(dg_test::fixture("dg_wide"));
  for (cpu::Precision p : {cpu::Precision::kExact, cpu::Precision::kFast}) {
    cpu::EngineOptions eo;
    eo.precision = p;
    eo.threads = 1;
    INFO(cpu::precision_name(p));
    const auto reference = alone(model, eo);
    // The answers differ between requests (the comparison can fail).
    CHECK(reference[0] != reference[1]);
    int widest = 0;
    CHECK(batched(model, eo, 5, false, &widest) == reference);
    CHECK(widest >= 3);  // several sequences really shared passes
    CHECK(batched(model, eo, 2, false) == reference);
    CHECK(batched(model, eo, 3, true) == reference);
    eo.threads = 2;
    CHECK(batched(model, eo, 4, true) == reference);
    // At 4 or more sequences on 2 threads, passes attend one sequence per thread at a time.
    int widest_shared = 0;
    CHECK(batched(model, eo, 5, false, &widest_shared) == reference);
    CHECK(widest_shared >= 4);
  }
}

TEST_CASE("the memory budget bounds the running requests; the rest wait their turn", "[runtime][batch]") {
  auto model = cpu::Model::load(dg_test::fixture("dg_small"));
  CpuEngine engine(model);
  const auto cs = cases(*model);
  std::size_t largest = 0;
  for (const auto& c : cs) {
    Sequence<CpuEngine, ReferenceSampler, CanvasScheduler<>> s(engine, c.prompt, c.options);
    largest = std::max(largest, s.bytes());
  }
  Batcher::Limits limits;
  limits.max_batch = 8;
  limits.memory_budget_bytes = 2 * largest + largest / 2;  // room for two requests at most
  Batcher batcher(engine, limits);
  int finished = 0;
  for (const auto& c : cs) {
    Batcher::Request r;
    r.prompt = c.prompt;
    r.options = c.options;
    r.on_done = [&](const GenerationResult&, const Status& st) {
      CHECK(st.ok());
      ++finished;
    };
    batcher.submit(std::move(r));
  }
  std::size_t most = 0;
  while (batcher.step()) {
    const auto st = batcher.stats();
    most = std::max(most, st.active);
    CHECK(st.bytes_in_use <= limits.memory_budget_bytes);
  }
  CHECK(finished == 5);
  CHECK(most == 2);
  CHECK(batcher.stats().bytes_in_use == 0);

  // A request that can never fit is refused at once, naming the budget.
  Batcher::Limits tiny;
  tiny.memory_budget_bytes = 1024;
  Batcher small(engine, tiny);
  Batcher::Request r;
  r.prompt = cs[0].prompt;
  r.options = cs[0].options;
  try {
    small.submit(std::move(r));
    FAIL("expected a refusal");
  } catch (const Error& e) {
    CHECK(e.code() == StatusCode::kOutOfRange);
    CHECK(std::string(e.what()).find("memory budget") != std::string::npos);
  }
}

TEST_CASE("a full queue refuses with kUnavailable; bad requests are refused at submit", "[runtime][batch]") {
  auto model = cpu::Model::load(dg_test::fixture("dg_small"));
  CpuEngine engine(model);
  const auto cs = cases(*model);
  Batcher::Limits limits;
  limits.max_queue = 2;
  Batcher batcher(engine, limits);
  const auto request = [&](std::vector<std::int32_t> prompt) {
    Batcher::Request r;
    r.prompt = std::move(prompt);
    r.options = cs[0].options;
    return r;
  };
  batcher.submit(request(cs[0].prompt));
  batcher.submit(request(cs[1].prompt));
  try {
    batcher.submit(request(cs[2].prompt));
    FAIL("expected kUnavailable");
  } catch (const Error& e) {
    CHECK(e.code() == StatusCode::kUnavailable);
  }
  try {
    batcher.submit(request({2, static_cast<std::int32_t>(model->config().vocab_size)}));
    FAIL("expected an invalid token id");
  } catch (const Error& e) {
    CHECK(std::string(e.what()).find("prompt") != std::string::npos);
  }
}

TEST_CASE("cancellation ends a request before the next pass and frees its memory", "[runtime][batch]") {
  auto model = cpu::Model::load(dg_test::fixture("dg_wide"));
  cpu::EngineOptions eo;
  eo.threads = 1;
  const auto reference = alone(model, eo);
  CpuEngine engine(model, eo);
  Batcher batcher(engine, Batcher::Limits{});
  const auto cs = cases(*model);
  std::vector<Status> status(cs.size());
  std::vector<std::vector<std::int32_t>> out(cs.size());
  std::vector<Batcher::RequestId> ids;
  std::map<std::size_t, int> steps_after_cancel;
  bool cancelled = false;
  for (std::size_t i = 0; i < cs.size(); ++i) {
    Batcher::Request r;
    r.prompt = cs[i].prompt;
    r.options = cs[i].options;
    r.callbacks.on_step = [&, i](const StepEvent&) {
      if (cancelled && i == 1) ++steps_after_cancel[i];
      return true;
    };
    r.on_done = [&, i](const GenerationResult& g, const Status& st) {
      status[i] = st;
      out[i] = answer(g);
    };
    ids.push_back(batcher.submit(std::move(r)));
  }
  batcher.step();  // prefill and the first step of everyone
  batcher.step();
  const std::size_t before = batcher.stats().bytes_in_use;
  batcher.cancel(ids[1]);
  cancelled = true;
  batcher.step();
  CHECK(steps_after_cancel[1] == 0);
  CHECK(status[1].code() == StatusCode::kCancelled);
  CHECK(batcher.stats().bytes_in_use < before);
  while (batcher.step()) {
  }
  for (std::size_t i = 0; i < cs.size(); ++i) {
    if (i == 1) continue;
    CHECK(status[i].ok());
    CHECK(out[i] == reference[i]);  // the others are undisturbed
  }
  CHECK(batcher.stats().bytes_in_use == 0);
  CHECK(batcher.stats().cancelled == 1);
}

namespace {

// The CPU engine with faults to order: KV caches that cannot be allocated, batched denoising
// passes that run out of memory (as a pass whose buffers grow with the batch can).
struct FaultyEngine : CpuEngine {
  using CpuEngine::CpuEngine;
  mutable int caches_to_refuse = 0;
  int denoise_passes_to_fail = 0;
  Cache make_cache(std::int64_t capacity) const {
    if (caches_to_refuse > 0) {
      --caches_to_refuse;
      throw std::bad_alloc();
    }
    return CpuEngine::make_cache(capacity);
  }
  void denoise_step_batch(DenoiseItem<Cache, DenoiseState>* items, std::size_t count) {
    if (denoise_passes_to_fail > 0) {
      --denoise_passes_to_fail;
      throw std::bad_alloc();
    }
    CpuEngine::denoise_step_batch(items, count);
  }
};

}  // namespace

TEST_CASE("requests that run out of memory end with kOutOfMemory; the others go on", "[runtime][batch]") {
  auto model = cpu::Model::load(dg_test::fixture("dg_small"));
  cpu::EngineOptions eo;
  eo.threads = 1;
  const auto reference = alone(model, eo);
  FaultyEngine engine(model, eo);
  ContinuousBatcher<FaultyEngine>::Limits limits;
  limits.max_batch = 2;
  limits.memory_budget_bytes = std::size_t{1} << 30;
  ContinuousBatcher<FaultyEngine> batcher(engine, limits);
  const auto cs = cases(*model);
  std::vector<Status> status(cs.size());
  std::vector<int> calls(cs.size(), 0);
  std::vector<std::vector<std::int32_t>> out(cs.size());
  for (std::size_t i = 0; i < cs.size(); ++i) {
    ContinuousBatcher<FaultyEngine>::Request r;
    r.prompt = cs[i].prompt;
    r.options = cs[i].options;
    r.on_done = [&, i](const GenerationResult& g, const Status& st) {
      status[i] = st;
      out[i] = answer(g);
      ++calls[i];
    };
    batcher.submit(std::move(r));
  }
  // The first request's cache cannot be allocated: it ends, takes no budget, and the next two run.
  engine.caches_to_refuse = 1;
  REQUIRE_NOTHROW(batcher.step());
  CHECK(calls[0] == 1);
  CHECK(status[0].code() == StatusCode::kOutOfMemory);
  CHECK(batcher.stats().active == 2);
  CHECK(batcher.stats().bytes_in_use < limits.memory_budget_bytes);
  // Their next denoising pass runs out of memory: both end with the error instead of the batcher
  // throwing (and retrying the same pass on every step).
  engine.denoise_passes_to_fail = 1;
  REQUIRE_NOTHROW(batcher.step());
  CHECK(calls[1] == 1);
  CHECK(calls[2] == 1);
  CHECK(status[1].code() == StatusCode::kOutOfMemory);
  CHECK(status[2].code() == StatusCode::kOutOfMemory);
  CHECK(std::string(status[1].message()).find("denoising pass") != std::string::npos);
  while (batcher.step()) {
  }
  for (std::size_t i = 3; i < cs.size(); ++i) {
    CHECK(calls[i] == 1);
    CHECK(status[i].ok());
    CHECK(out[i] == reference[i]);
  }
  CHECK(batcher.stats().bytes_in_use == 0);
  CHECK(batcher.stats().failed == 3);
}

TEST_CASE("an on_done that throws does not cost the other requests theirs", "[runtime][batch]") {
  auto model = cpu::Model::load(dg_test::fixture("dg_small"));
  CpuEngine engine(model);
  Batcher batcher(engine, Batcher::Limits{});
  const auto cs = cases(*model);
  int second = 0;
  std::vector<Batcher::RequestId> ids;
  for (int i = 0; i < 2; ++i) {
    Batcher::Request r;
    r.prompt = cs[static_cast<std::size_t>(i)].prompt;
    r.options = cs[static_cast<std::size_t>(i)].options;
    if (i == 0) {
      r.on_done = [](const GenerationResult&, const Status&) { throw std::runtime_error("a client's callback failed"); };
    } else {
      r.on_done = [&](const GenerationResult&, const Status& st) {
        CHECK(st.code() == StatusCode::kCancelled);
        ++second;
      };
    }
    ids.push_back(batcher.submit(std::move(r)));
  }
  batcher.cancel(ids[0]);  // both end in the same step, the throwing one first
  batcher.cancel(ids[1]);
  CHECK_THROWS_WITH(batcher.step(), Catch::Matchers::Contains("a client's callback failed"));
  CHECK(second == 1);
  CHECK(batcher.stats().cancelled == 2);
}

TEST_CASE("an on_commit that throws ends its request with the canvas recorded once", "[runtime][batch]") {
  auto model = cpu::Model::load(dg_test::fixture("dg_small"));
  CpuEngine engine(model);
  Batcher batcher(engine, Batcher::Limits{});
  const auto cs = cases(*model);
  Batcher::Request r;
  r.prompt = cs[0].prompt;
  r.options = cs[0].options;  // one canvas: the last, committed from within its denoising step
  r.callbacks.on_commit = [](const CommitEvent&) -> bool { throw std::runtime_error("the client's sink failed"); };
  int calls = 0;
  r.on_done = [&](const GenerationResult& g, const Status& st) {
    ++calls;
    CHECK(st.code() == StatusCode::kInternal);
    CHECK(st.message().find("the client's sink failed") != std::string::npos);
    REQUIRE(g.canvases.size() == 1);
    CHECK(g.canvases[0].stop != CanvasStop::kCancelled);
  };
  batcher.submit(std::move(r));
  while (batcher.step()) {
  }
  CHECK(calls == 1);
}

TEST_CASE("BatchDecoder lays rows out as transformers' batched generate does", "[runtime][batch]") {
  auto model = cpu::Model::load(dg_test::fixture("dg_small"));
  cpu::EngineOptions eo;
  eo.threads = 1;
  Decoder<CpuEngine> single(model, eo);
  BatchDecoder<CpuEngine> batch(model, eo);
  const auto cs = cases(*model);
  std::vector<std::vector<std::int32_t>> prompts;
  std::vector<Options> options;
  for (const auto& c : cs) {
    prompts.push_back(c.prompt);
    Options o = c.options;
    o.scheduler.max_new_tokens = 3 * model->config().canvas_length;  // transformers: one length for the batch
    options.push_back(o);
  }
  const BatchResult r = batch.generate(prompts, options, BatchGenerateOptions{2, -7});
  std::size_t longest = 0, width = 0;
  for (const auto& p : prompts) longest = std::max(longest, p.size());
  for (const auto& s : r.sequences) width = std::max(width, s.size());
  for (std::size_t i = 0; i < prompts.size(); ++i) {
    const GenerationResult alone_run = single.generate(prompts[i], options[i]);
    CHECK(answer(r.rows[i]) == answer(alone_run));
    const auto& s = r.sequences[i];
    CHECK(s.size() == width);
    const std::size_t pad = longest - prompts[i].size();
    for (std::size_t j = 0; j < pad; ++j) CHECK(s[j] == -7);
    CHECK(std::vector<std::int32_t>(s.begin() + pad, s.begin() + longest) == prompts[i]);
    CHECK(std::vector<std::int32_t>(s.begin() + longest, s.begin() + longest + alone_run.tokens.size()) == alone_run.tokens);
    for (std::size_t j = longest + alone_run.tokens.size(); j < s.size(); ++j) CHECK(s[j] == options[i].scheduler.pad_token_id);
  }
  // transformers measures max_length from the left-padded prompts: with the budget it sets
  // (max_new_tokens at its default), every row gets max_length - longest new tokens, one canvas
  // and a bit here, so two canvases each, however short its own prompt.
  const int C = model->config().canvas_length;
  std::vector<Options> limited = options;
  for (auto& o : limited) {
    o.scheduler.max_new_tokens = GenerationConfig::kDefaultMaxNewTokens;
    o.scheduler.max_length = static_cast<int>(longest) + C + 1;
  }
  const BatchResult lr = batch.generate(prompts, limited);
  for (std::size_t i = 0; i < prompts.size(); ++i) {
    INFO("row " << i);
    CHECK(lr.sequences[i].size() == longest + 2 * static_cast<std::size_t>(C));
    if (lr.rows[i].finish != Finish::kStopToken) CHECK(lr.rows[i].canvases.size() == 2);
  }
  // Without PAD, transformers goes on generating rows that stopped: refused rather than imitated.
  std::vector<Options> no_pad = options;
  no_pad[1].scheduler.pad_token_id = kNoPadToken;
  CHECK_THROWS_WITH(batch.generate(prompts, no_pad), Catch::Matchers::Contains("row 1 has no pad_token_id"));
  // ... but rows that cannot stop early (no stop ids, one budget) run without it, as transformers does.
  for (auto& o : no_pad) {
    o.scheduler.pad_token_id = kNoPadToken;
    o.scheduler.stop_token_ids.clear();
  }
  const BatchResult np = batch.generate(prompts, no_pad, BatchGenerateOptions{2, -7});
  for (std::size_t i = 0; i < prompts.size(); ++i) {
    INFO("row " << i);
    CHECK(answer(np.rows[i]) == answer(single.generate(prompts[i], no_pad[i])));
    CHECK(np.sequences[i].size() == longest + 3 * static_cast<std::size_t>(C));
  }
  // A max_length of its own can end a row early too (it used to come back padded with -1).
  std::vector<Options> own_limit = no_pad;
  own_limit[1].scheduler.max_length = static_cast<int>(longest) + C;
  CHECK_THROWS_WITH(batch.generate(prompts, own_limit), Catch::Matchers::Contains("row 1 has no pad_token_id"));
  // A limit the longest prompt already reaches is named with that prompt, not the row's own.
  std::vector<Options> short_limit = limited;
  for (auto& o : short_limit) o.scheduler.max_length = static_cast<int>(longest);
  CHECK_THROWS_WITH(batch.generate(prompts, short_limit),
                    Catch::Matchers::Contains("row 0: max_length " + std::to_string(longest) +
                                              " leaves no new token after the batch's longest prompt"));
  // A row the plan refuses is named.
  std::vector<std::vector<std::int32_t>> with_empty = prompts;
  with_empty[2].clear();
  CHECK_THROWS_WITH(batch.generate(with_empty, options), Catch::Matchers::Contains("row 2: the prompt is empty"));
  // Mismatched options are refused before any work.
  options.pop_back();
  CHECK_THROWS_AS(batch.generate(prompts, options), Error);
}

namespace {

// Masks by place in the pass: sequence 1 gets the JAX canvas window, every other sequence
// transformers' masks.
struct PerSequenceAttention {
  static bool visible(AttentionMode mode, LayerType type, int window, std::int64_t query_pos, std::int64_t key_pos,
                      std::int64_t pass_begin, int sequence) {
    return sequence == 1 ? JaxCanvasAttention::visible(mode, type, window, query_pos, key_pos, pass_begin)
                         : Gemma4Attention::visible(mode, type, window, query_pos, key_pos, pass_begin);
  }
  static std::int64_t first_visible_cached(AttentionMode mode, LayerType type, int window, std::int64_t pass_begin) {
    return Gemma4Attention::first_visible_cached(mode, type, window, pass_begin);
  }
};

template <class E>
VocabPassResult one_step(E& engine, const typename E::Cache& cache, const std::vector<std::int32_t>& canvas) {
  VocabPassArgs args;
  args.key = DrawKey{5, 0, 0};
  VocabPassResult r;
  engine.denoise_step(canvas.data(), static_cast<std::int64_t>(canvas.size()), true, cache, args, r);
  return r;
}

}  // namespace

TEST_CASE("the attention policy receives each sequence's index in a batched pass", "[runtime][batch]") {
  auto model = cpu::Model::load(dg_test::fixture("dg_wide"));
  cpu::EngineOptions eo;
  eo.threads = 1;
  cpu::Engine<Backbone<PerSequenceAttention, Gemma4MoE>> mixed(model, eo);
  cpu::Engine<Backbone<Gemma4Attention, Gemma4MoE>> reference(model, eo);
  cpu::Engine<Backbone<JaxCanvasAttention, Gemma4MoE>> jax(model, eo);
  const int C = model->config().canvas_length;
  std::vector<std::int32_t> prompt{2}, canvas;
  for (int i = 0; i < 3 * model->config().sliding_window; ++i) prompt.push_back(3 + (i * 17) % 100);
  for (int i = 0; i < C; ++i) canvas.push_back(5 + (i * 29) % 100);
  auto cache = mixed.make_cache(static_cast<std::int64_t>(prompt.size()) + C);
  mixed.encode(prompt.data(), static_cast<std::int64_t>(prompt.size()), cache);  // encoder masks agree

  using Item = DenoiseItem<cpu::KvCache, std::vector<float>>;
  VocabPassResult out[2];
  std::vector<float> state[2];
  Item items[2];
  for (int i = 0; i < 2; ++i) {
    items[i].canvas = canvas.data();
    items[i].n = C;
    items[i].cache = &cache;  // denoising only reads the cache: both read one
    items[i].args.key = DrawKey{5, 0, 0};
    items[i].stats = &out[i];
    items[i].state = &state[i];
  }
  mixed.denoise_step_batch(items, 2);
  const VocabPassResult a = one_step(reference, cache, canvas), b = one_step(jax, cache, canvas);
  CHECK(a.entropy != b.entropy);  // the two masks really differ on this prompt
  CHECK(out[0].entropy == a.entropy);
  CHECK(out[0].argmax == a.argmax);
  CHECK(out[1].entropy == b.entropy);
  CHECK(out[1].argmax == b.argmax);
}
