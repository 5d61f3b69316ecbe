// SPDX-License-Identifier: Apache-2.0
// The streaming vocabulary pass against a materialising oracle (full [C, V] logits, then the
// textbook formulas in double precision), and its sampler against the softmax distribution.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <diffusion_gemma/cpu/engine.hpp>

#include "support/catch.hpp"
#include "support/paths.hpp"

using namespace diffusion_gemma;

namespace {

struct Oracle {
  std::vector<int> argmax;
  std::vector<double> entropy;
  std::vector<double> soft;  // [C, H]
  std::vector<std::vector<double>> probs;
};

Oracle oracle(const std::vector<float>& logits, std::int64_t C, std::int64_t V, const float* E, std::int64_t H,
              float T, float embed_scale) {
  Oracle o;
  o.soft.assign(static_cast<std::size_t>(C * H), 0.0);
  for (std::int64_t r = 0; r < C; ++r) {
    const float* l = logits.data() + r * V;
    std::vector<double> x(static_cast<std::size_t>(V));
    for (std::int64_t i = 0; i < V; ++i) x[i] = static_cast<double>(l[i] / T);
    o.argmax.push_back(static_cast<int>(std::max_element(x.begin(), x.end()) - x.begin()));
    const double m = *std::max_element(x.begin(), x.end());
    double s = 0.0;
    for (double v : x) s += std::exp(v - m);
    std::vector<double> p(static_cast<std::size_t>(V));
    double h = 0.0;
    for (std::int64_t i = 0; i < V; ++i) {
      p[i] = std::exp(x[i] - m) / s;
      if (p[i] > 0) h -= p[i] * std::log(p[i]);
      for (std::int64_t k = 0; k < H; ++k) o.soft[r * H + k] += p[i] * E[i * H + k] * embed_scale;
    }
    o.entropy.push_back(h);
    o.probs.push_back(p);
  }
  return o;
}

// The embedding table widened to fp32 (the oracle's input; the engine reads it in its stored dtype).
std::vector<float> embedding_f32(const cpu::Model& m) {
  const Weight& E = m.weights().embed_tokens;
  std::vector<float> out(static_cast<std::size_t>(E.numel()));
  for (std::int64_t i = 0; i < E.numel(); ++i) out[static_cast<std::size_t>(i)] = E.at(i);
  return out;
}

Weight f32_weight(const std::vector<float>& v, std::int64_t rows, std::int64_t cols) {
  Weight w;
  w.data = reinterpret_cast<const std::byte*>(v.data());
  w.dtype = DType::kF32;
  w.shape = Shape{rows, cols};
  return w;
}

}  // namespace

TEST_CASE("streaming vocabulary pass equals the materialising oracle", "[cpu][vocab]") {
  auto model = cpu::Model::load(dg_test::fixture("dg_wide"));
  cpu::EngineOptions exact;
  exact.precision = cpu::Precision::kExact;  // the oracle's tolerances are fp32's
  cpu::Engine<DiffusionGemmaBackbone> engine(model, exact);
  const auto& cfg = model->config();
  const std::int64_t C = cfg.canvas_length, H = cfg.hidden_size, V = cfg.vocab_size;
  cpu::KvCache cache = engine.make_cache(32);
  std::vector<std::int32_t> prompt{5, 17, 99, 3}, canvas(static_cast<std::size_t>(C));
  for (std::int64_t i = 0; i < C; ++i) canvas[i] = static_cast<std::int32_t>((i * 37 + 11) % V);
  engine.encode(prompt.data(), 4, cache);
  std::vector<float> hidden(C * H), logits(C * V);
  engine.denoise(canvas.data(), C, nullptr, cache, hidden.data());
  engine.lm_head(hidden.data(), C, logits.data());
  const std::vector<float> E = embedding_f32(*model);

  for (float T : {1.0f, 0.8f, 0.4083333f, 0.05f}) {
    const Oracle o = oracle(logits, C, V, E.data(), H, T, model->embed_scale());
    VocabPassArgs args;
    args.temperature = T;
    args.key = DrawKey{7, 0, 0};
    VocabPassResult r;
    engine.vocab_pass(hidden.data(), C, args, r);
    double max_h = 0.0, max_soft = 0.0;
    for (std::int64_t i = 0; i < C; ++i) {
      CHECK(r.argmax[i] == o.argmax[i]);
      CHECK(r.sample[i] >= 0);
      CHECK(r.sample[i] < V);
      max_h = std::max(max_h, std::abs(r.entropy[i] - o.entropy[i]));
    }
    for (std::int64_t i = 0; i < C * H; ++i) max_soft = std::max(max_soft, std::abs(r.soft_embedding[i] - o.soft[i]));
    // fp32 streaming vs double oracle: entropies to 1e-5 nats, soft embeddings to 1e-4 (values ~1).
    CHECK(max_h < 1e-5);
    CHECK(max_soft < 1e-4);
  }
  SECTION("the same draws give the same samples; other keys give other samples") {
    VocabPassArgs a;
    a.key = DrawKey{1, 2, 3};
    VocabPassResult r1, r2, r3;
    engine.vocab_pass(hidden.data(), C, a, r1);
    engine.vocab_pass(hidden.data(), C, a, r2);
    CHECK(r1.sample == r2.sample);
    a.key.step = 4;
    engine.vocab_pass(hidden.data(), C, a, r3);
    CHECK(r1.sample != r3.sample);
  }
}

TEST_CASE("chunked Gumbel sampling follows the softmax distribution", "[cpu][vocab][statistics]") {
  // One position, V = 600 (three chunks, the last partial), a peaked and a flat region: 40000
  // draws over (canvas, step) keys. Pearson chi-square over ids with expected count >= 5.
  const std::int64_t V = 600, H = 4;
  std::vector<float> E(V * H, 0.0f), hidden(H, 0.0f);
  for (std::int64_t i = 0; i < V; ++i) E[i * H] = static_cast<float>(std::sin(0.37 * i) * 3.0 + (i == 300 ? 4.0 : 0.0));
  hidden[0] = 1.0f;
  cpu::VocabPass pass;
  cpu::KernelContext ctx;
  ctx.isa = cpu::default_isa();
  const Weight table = f32_weight(E, V, H);
  const float T = 0.7f;
  std::vector<double> p(V);
  double m = -1e30, s = 0.0;
  for (std::int64_t i = 0; i < V; ++i) m = std::max(m, static_cast<double>(E[i * H] / T));
  for (std::int64_t i = 0; i < V; ++i) s += p[i] = std::exp(E[i * H] / T - m);
  for (auto& x : p) x /= s;
  std::vector<int> counts(V, 0);
  const int draws = 40000;
  VocabPassResult r;
  for (int d = 0; d < draws; ++d) {
    VocabPassArgs a;
    a.temperature = T;
    a.soft_embedding = false;
    a.key = DrawKey{99, static_cast<std::uint32_t>(d / 64), static_cast<std::uint32_t>(d % 64)};
    pass.run(ctx, table, 0.0f, 1.0f, hidden.data(), 1, a, r);
    ++counts[r.sample[0]];
  }
  double chi2 = 0.0;
  int dof = -1;
  double rare_expected = 0.0, rare_seen = 0.0;
  for (std::int64_t i = 0; i < V; ++i) {
    const double e = p[i] * draws;
    if (e >= 5.0) {
      chi2 += (counts[i] - e) * (counts[i] - e) / e;
      ++dof;
    } else {
      rare_expected += e;
      rare_seen += counts[i];
    }
  }
  INFO("chi2 " << chi2 << " with " << dof << " degrees of freedom");
  // Far in the tail for dof up to ~300 (mean dof, sd sqrt(2 dof)); a biased sampler lands far above.
  CHECK(chi2 < dof + 6.0 * std::sqrt(2.0 * dof));
  CHECK(std::abs(rare_seen - rare_expected) < 6.0 * std::sqrt(rare_expected + 1.0));
}

TEST_CASE("the vocabulary pass gives the same bits at any thread count and for a row alone", "[cpu][vocab]") {
  // V = 600 is one tile (one shard: its rows are cut between threads), V = 3000 three shards, and
  // 9000 eight (the shards alone fill two or three threads). Random table and hidden states; every
  // row samples and accumulates a soft embedding.
  std::mt19937 gen(5);
  std::normal_distribution<float> normal;
  for (std::int64_t V : {std::int64_t{600}, std::int64_t{3000}, std::int64_t{9000}}) {
    const std::int64_t H = 40, C = 100;
    std::vector<float> E(static_cast<std::size_t>(V * H)), hidden(static_cast<std::size_t>(C * H));
    for (float& v : E) v = 0.3f * normal(gen);
    for (float& v : hidden) v = normal(gen);
    const Weight table = f32_weight(E, V, H);
    VocabPassArgs args;
    args.temperature = 0.9f;
    args.key = DrawKey{3, 1, 4};
    for (cpu::Precision precision : {cpu::Precision::kExact, cpu::Precision::kFast}) {
    const auto pass = [&](int threads, const float* rows, std::int64_t n) {
      cpu::KernelContext ctx;
      ctx.isa = cpu::default_isa();
      ctx.precision = precision;
      ctx.threads = threads;
      cpu::VocabPass vp;
      VocabPassResult r;
      vp.run(ctx, table, 30.0f, 1.5f, rows, n, args, r);
      return r;
    };
    const VocabPassResult one = pass(1, hidden.data(), C);
    for (int threads : {2, 3, 5}) {
      INFO(cpu::precision_name(precision) << " V " << V << " threads " << threads);
      const VocabPassResult many = pass(threads, hidden.data(), C);
      CHECK(many.argmax == one.argmax);
      CHECK(many.sample == one.sample);
      CHECK(many.entropy == one.entropy);
      CHECK(many.soft_embedding == one.soft_embedding);
    }
    // Row 0 alone: its draws are keyed by its position in its pass, 0 either way.
    const VocabPassResult alone = pass(2, hidden.data(), 1);
    INFO(cpu::precision_name(precision) << " V " << V << ": row 0 alone");
    CHECK(alone.argmax[0] == one.argmax[0]);
    CHECK(alone.sample[0] == one.sample[0]);
    CHECK(alone.entropy[0] == one.entropy[0]);
    CHECK(std::equal(alone.soft_embedding.begin(), alone.soft_embedding.end(), one.soft_embedding.begin()));
    }
  }
}

TEST_CASE("fast precision: the vocabulary pass on bf16 products stays within its stated tolerance", "[cpu][vocab][bf16]") {
  auto model = cpu::Model::load(dg_test::fixture("dg_wide"));
  cpu::EngineOptions eo;
  eo.precision = cpu::Precision::kFast;
  cpu::Engine<DiffusionGemmaBackbone> engine(model, eo);
  if (!engine.kernels().bf16_tiles() && !engine.kernels().bf16_dots()) {
    WARN("no AMX-BF16 or AVX512-BF16 on this CPU (or DG_CPU_ISA below them): the vocabulary pass is exact here");
    return;
  }
  cpu::EngineOptions exact_options;
  exact_options.precision = cpu::Precision::kExact;
  cpu::Engine<DiffusionGemmaBackbone> exact(model, exact_options);
  const auto& cfg = model->config();
  const std::int64_t C = cfg.canvas_length, H = cfg.hidden_size, V = cfg.vocab_size;
  cpu::KvCache cache = exact.make_cache(32);
  std::vector<std::int32_t> prompt{5, 17, 99, 3}, canvas(static_cast<std::size_t>(C));
  for (std::int64_t i = 0; i < C; ++i) canvas[i] = static_cast<std::int32_t>((i * 37 + 11) % V);
  exact.encode(prompt.data(), 4, cache);
  std::vector<float> hidden(C * H), logits(C * V);
  exact.denoise(canvas.data(), C, nullptr, cache, hidden.data());
  exact.lm_head(hidden.data(), C, logits.data());
  const std::vector<float> E = embedding_f32(*model);
  for (float T : {1.0f, 0.5f}) {
    const Oracle o = oracle(logits, C, V, E.data(), H, T, model->embed_scale());
    VocabPassArgs args;
    args.temperature = T;
    VocabPassResult r;
    engine.vocab_pass(hidden.data(), C, args, r);
    double max_h = 0.0, max_soft = 0.0, soft_scale = 0.0;
    int argmax_agree = 0;
    for (std::int64_t i = 0; i < C; ++i) {
      argmax_agree += r.argmax[i] == o.argmax[i];
      max_h = std::max(max_h, std::abs(r.entropy[i] - o.entropy[i]));
    }
    for (std::int64_t i = 0; i < C * H; ++i) {
      max_soft = std::max(max_soft, std::abs(r.soft_embedding[i] - o.soft[i]));
      soft_scale = std::max(soft_scale, std::abs(o.soft[i]));
    }
    INFO("T " << T << ": argmax agreement " << argmax_agree << "/" << C << ", max entropy error " << max_h
              << " nats, max soft error " << max_soft << " of " << soft_scale);
    // bf16 inputs (8-bit mantissa), fp32 accumulation: entropies within 0.05 nats, soft embedding
    // within 2% of its largest element; the argmax may move only where the top two logits nearly tie.
    CHECK(max_h < 0.05);
    CHECK(max_soft < 0.02 * soft_scale);
    CHECK(argmax_agree >= C - 1);
  }
}

// encode_batch skips an item of no tokens, as its loop does: one empty item (say, a sequence with
// nothing left to commit) must not fail the call. The others cache exactly the bits encode() caches
// for each alone, and the empty item's cache keeps its positions and contents.
TEST_CASE("encode_batch: an empty item is a no-op beside the others", "[cpu][engine]") {
  auto model = cpu::Model::load(dg_test::fixture("dg_wide"));
  cpu::Engine<DiffusionGemmaBackbone> engine(model);
  const auto& cfg = model->config();
  const std::int64_t capacity = 32;
  const std::vector<std::int32_t> a{5, 17, 99, 3, 42}, b{7, 8, 200}, before{11, 12};
  cpu::KvCache alone_a = engine.make_cache(capacity), alone_b = engine.make_cache(capacity);
  cpu::KvCache batched_a = engine.make_cache(capacity), batched_b = engine.make_cache(capacity);
  cpu::KvCache empty = engine.make_cache(capacity), empty_ref = engine.make_cache(capacity);
  engine.encode(a.data(), 5, alone_a);
  engine.encode(b.data(), 3, alone_b);
  engine.encode(before.data(), 2, empty);
  engine.encode(before.data(), 2, empty_ref);
  const EncodeItem<cpu::KvCache> items[] = {{a.data(), 5, &batched_a}, {nullptr, 0, &empty}, {b.data(), 3, &batched_b}};
  REQUIRE_NOTHROW(engine.encode_batch(items, 3));
  REQUIRE(batched_a.length() == 5);
  REQUIRE(batched_b.length() == 3);
  REQUIRE(empty.length() == 2);
  for (int l = 0; l < cfg.num_layers(); ++l) {
    const LayerSpec& spec = cfg.layers[static_cast<std::size_t>(l)];
    const std::size_t bytes = static_cast<std::size_t>(capacity * spec.head_dim) * sizeof(float);
    for (int g = 0; g < spec.num_kv_heads; ++g) {
      INFO("layer " << l << " KV head " << g);
      CHECK(std::memcmp(batched_a.keys(l, g), alone_a.keys(l, g), bytes) == 0);
      CHECK(std::memcmp(batched_a.values(l, g), alone_a.values(l, g), bytes) == 0);
      CHECK(std::memcmp(batched_b.keys(l, g), alone_b.keys(l, g), bytes) == 0);
      CHECK(std::memcmp(batched_b.values(l, g), alone_b.values(l, g), bytes) == 0);
      CHECK(std::memcmp(empty.keys(l, g), empty_ref.keys(l, g), bytes) == 0);
      CHECK(std::memcmp(empty.values(l, g), empty_ref.values(l, g), bytes) == 0);
    }
  }
}

// The batch contract (sampler/batch_item_checks.hpp, shared with the CUDA engine): every item is
// checked before any work, so a bad item names itself and leaves every cache as it was.
TEST_CASE("encode_batch and denoise_step_batch refuse a bad item before touching any other", "[cpu][engine]") {
  auto model = cpu::Model::load(dg_test::fixture("dg_wide"));
  cpu::Engine<DiffusionGemmaBackbone> engine(model);
  const std::int32_t V = static_cast<std::int32_t>(model->config().vocab_size);
  const std::vector<std::int32_t> good{5, 17, 99}, bad{5, V, 3};
  cpu::KvCache c0 = engine.make_cache(16), c1 = engine.make_cache(16);
  const auto message = [](const auto& call) -> std::string {
    try {
      call();
    } catch (const Error& e) {
      return e.what();
    }
    return "no error";
  };
  const auto contains = [](const std::string& text, const std::string& part) {
    const bool found = text.find(part) != std::string::npos;
    if (!found) UNSCOPED_INFO("message: " << text << "\nexpected to contain: " << part);
    return found;
  };
  {
    const EncodeItem<cpu::KvCache> items[] = {{good.data(), 3, &c0}, {bad.data(), 3, &c1}};
    CHECK(contains(message([&] { engine.encode_batch(items, 2); }), "token id " + std::to_string(V) + " at position 1"));
  }
  {
    const EncodeItem<cpu::KvCache> items[] = {{good.data(), 3, &c0}, {good.data(), 3, &c0}};
    CHECK(contains(message([&] { engine.encode_batch(items, 2); }), "items 0 and 1 share one KV cache"));
  }
  {
    const EncodeItem<cpu::KvCache> items[] = {{good.data(), 3, &c0}, {nullptr, 2, &c1}};
    CHECK(contains(message([&] { engine.encode_batch(items, 2); }), "item 1 has no cache or no tokens"));
  }
  CHECK(c0.length() == 0);  // nothing was encoded by the refused calls
  CHECK(c1.length() == 0);
  engine.encode(good.data(), 3, c0);
  engine.encode(good.data(), 3, c1);

  using Item = DenoiseItem<cpu::KvCache, cpu::Engine<DiffusionGemmaBackbone>::DenoiseState>;
  VocabPassResult r0, r1;
  cpu::Engine<DiffusionGemmaBackbone>::DenoiseState s0{1.0f, 2.0f}, s1;
  Item items[2];
  items[0] = Item{good.data(), 3, false, &c0, VocabPassArgs{}, &r0, &s0};
  items[1] = Item{nullptr, 3, true, &c1, VocabPassArgs{}, &r1, &s1};
  CHECK(contains(message([&] { engine.denoise_step_batch(items, 2); }),
                 "item 1 needs a canvas, a cache, a result and a state"));
  items[1].canvas = bad.data();
  CHECK(contains(message([&] { engine.denoise_step_batch(items, 2); }), "canvas: token id " + std::to_string(V)));
  CHECK(s0 == std::vector<float>{1.0f, 2.0f});  // item 0's self-conditioning state untouched
  CHECK(r0.argmax.empty());
}

TEST_CASE("an engine's thread count also bounds the packing of its weights at construction", "[cpu]") {
  // The first fast or AVX2/AVX-512 engine on a model packs its matrices (cpu/tile_pack.hpp). That
  // packing took default_threads() whatever EngineOptions::threads said, and left those workers
  // alive in the constructing thread's team. A fresh thread has a team with no workers yet.
  if (cpu::default_threads() < 2 || cpu::default_isa() == cpu::Isa::kGeneric) {
    WARN("needs two CPUs and a packing kernel family (not generic) to tell the thread counts apart");
    return;
  }
  int workers_after = -1;
  std::thread t([&] {
    auto model = cpu::Model::load(dg_test::fixture("quant/base"));  // BF16: packed on every such path
    cpu::EngineOptions one;
    one.threads = 1;
    cpu::Engine<DiffusionGemmaBackbone> engine(model, one);
    workers_after = cpu::ThreadTeam::of_this_thread().workers();
  });
  t.join();
  CHECK(workers_after == 0);
}
