// SPDX-License-Identifier: Apache-2.0
// The CPU backbone against transformers: golden logits written by tools/reference/make_fixtures.py
// from tiny random checkpoints (every parameter and buffer randomised).
//
// Tolerance: both sides compute in fp32 from fp32 weights; they differ only in summation order
// (Eigen vs oneDNN GEMMs, softmax reductions) and libm rounding, a few 1e-6 relative per op. The
// largest difference seen over all fixtures is 1.5e-5 (run with DG_TEST_VERBOSE=1 to print them);
// 2e-4 leaves 10x headroom and is still ~1000x below what a real bug does (a wrong norm, mask or
// RoPE pair moves logits by 1e-1 or more).
#include <cstdlib>
#include <string>
#include <vector>

#include <diffusion_gemma/cpu/engine.hpp>
#include <diffusion_gemma/io/safetensors.hpp>

#include "support/catch.hpp"
#include "support/golden.hpp"
#include "support/paths.hpp"

using namespace diffusion_gemma;

namespace {

constexpr double kLogitTolerance = 2e-4;

template <class Backbone>
struct Harness {
  std::shared_ptr<const cpu::Model> model;
  cpu::Engine<Backbone> engine;
  std::int64_t V, H;
  explicit Harness(const std::string& dir, cpu::EngineOptions opts = {})
      : model(cpu::Model::load(dir)), engine(model, opts), V(model->config().vocab_size), H(model->config().hidden_size) {}

  std::vector<float> encode_logits(const std::vector<std::int32_t>& ids, cpu::KvCache& cache) {
    std::vector<float> hidden(ids.size() * H), logits(ids.size() * V);
    engine.encode(ids.data(), static_cast<std::int64_t>(ids.size()), cache, hidden.data());
    engine.lm_head(hidden.data(), static_cast<std::int64_t>(ids.size()), logits.data());
    return logits;
  }
  std::vector<float> denoise_logits(const std::vector<std::int32_t>& ids, const cpu::KvCache& cache,
                                    const float* soft = nullptr) {
    std::vector<float> hidden(ids.size() * H), logits(ids.size() * V);
    engine.denoise(ids.data(), static_cast<std::int64_t>(ids.size()), soft, cache, hidden.data());
    engine.lm_head(hidden.data(), static_cast<std::int64_t>(ids.size()), logits.data());
    return logits;
  }
};

void check_dg_fixture(const std::string& name, cpu::EngineOptions opts = {}) {
  Harness<DiffusionGemmaBackbone> h(dg_test::fixture(name), opts);
  const io::SafetensorsFile golden(dg_test::fixture(name + "/golden.safetensors"));
  const std::int64_t C = h.model->config().canvas_length;
  for (int k = 0; k < 3; ++k) {
    const std::string c = "case" + std::to_string(k) + ".";
    const auto prompt = dg_test::ids(golden, c + "prompt_ids");
    INFO(name << " " << c << " prompt length " << prompt.size());
    cpu::KvCache cache = h.engine.make_cache(static_cast<std::int64_t>(prompt.size()) + 2 * C);
    const double enc = dg_test::max_abs_diff(h.encode_logits(prompt, cache), dg_test::floats(golden, c + "encoder_logits"));
    const auto canvas = dg_test::ids(golden, c + "canvas_ids");
    const double den = dg_test::max_abs_diff(h.denoise_logits(canvas, cache), dg_test::floats(golden, c + "denoise_logits"));
    const auto sc_logits = dg_test::floats(golden, c + "sc_logits");
    std::vector<float> soft(C * h.H);
    h.engine.soft_embedding_from_logits(sc_logits.data(), C, soft.data());
    const double den_sc =
        dg_test::max_abs_diff(h.denoise_logits(canvas, cache, soft.data()), dg_test::floats(golden, c + "denoise_sc_logits"));
    CHECK(cache.length() == static_cast<std::int64_t>(prompt.size()));  // the denoiser never writes the cache
    const double commit =
        dg_test::max_abs_diff(h.encode_logits(dg_test::ids(golden, c + "commit_ids"), cache), dg_test::floats(golden, c + "commit_logits"));
    const double den2 = dg_test::max_abs_diff(h.denoise_logits(dg_test::ids(golden, c + "canvas2_ids"), cache),
                                              dg_test::floats(golden, c + "denoise2_logits"));
    if (std::getenv("DG_TEST_VERBOSE")) WARN(name << " " << c << " max |diff|: encoder " << enc << ", denoise " << den << ", denoise+SC " << den_sc
                       << ", commit " << commit << ", second canvas " << den2);
    CHECK(enc < kLogitTolerance);
    CHECK(den < kLogitTolerance);
    CHECK(den_sc < kLogitTolerance);
    CHECK(commit < kLogitTolerance);
    CHECK(den2 < kLogitTolerance);
  }
}

}  // namespace

TEST_CASE("DiffusionGemma backbone matches transformers: encoder, denoiser, SC, commit, second canvas",
          "[model][cpu][golden]") {
  check_dg_fixture("dg_small");
  check_dg_fixture("dg_wide");
}

TEST_CASE("encoder chunking is exact: the same logits with 3-token passes", "[model][cpu][golden]") {
  cpu::EngineOptions opts;
  opts.max_pass_tokens = 3;
  check_dg_fixture("dg_small", opts);
}

TEST_CASE("plain Gemma 4 with the MoE block off (dense MLP, v_proj on full layers)", "[model][cpu][golden]") {
  Harness<Gemma4DenseBackbone> h(dg_test::fixture("gemma4_dense"));
  const io::SafetensorsFile golden(dg_test::fixture("gemma4_dense/golden.safetensors"));
  for (int k = 0; k < 2; ++k) {
    const std::string c = "case" + std::to_string(k) + ".";
    const auto ids = dg_test::ids(golden, c + "prompt_ids");
    cpu::KvCache cache = h.engine.make_cache(static_cast<std::int64_t>(ids.size()));
    const double err = dg_test::max_abs_diff(h.encode_logits(ids, cache), dg_test::floats(golden, c + "encoder_logits"));
    if (std::getenv("DG_TEST_VERBOSE")) WARN("gemma4_dense " << c << " max |diff| " << err);
    CHECK(err < kLogitTolerance);
    if (golden.find(c + "chunked_logits") != nullptr) {
      const std::size_t split = static_cast<std::size_t>(dg_test::ids(golden, c + "split")[0]);
      cpu::KvCache c2 = h.engine.make_cache(static_cast<std::int64_t>(ids.size()));
      auto a = h.encode_logits(std::vector<std::int32_t>(ids.begin(), ids.begin() + split), c2);
      const auto b = h.encode_logits(std::vector<std::int32_t>(ids.begin() + split, ids.end()), c2);
      a.insert(a.end(), b.begin(), b.end());
      CHECK(dg_test::max_abs_diff(a, dg_test::floats(golden, c + "chunked_logits")) < kLogitTolerance);
    }
  }
}

TEST_CASE("a backbone composed with the wrong experts policy is refused", "[model][cpu]") {
  auto model = cpu::Model::load(dg_test::fixture("gemma4_dense"));
  CHECK_THROWS_WITH(cpu::Engine<DiffusionGemmaBackbone>(model), Catch::Matchers::Contains("enable_moe_block is false"));
}

TEST_CASE("bad inputs to the backbone name the id or position", "[model][cpu]") {
  Harness<DiffusionGemmaBackbone> h(dg_test::fixture("dg_small"));
  cpu::KvCache cache = h.engine.make_cache(16);
  std::vector<std::int32_t> bad{1, 2, 131};
  CHECK_THROWS_WITH(h.engine.encode(bad.data(), 3, cache), Catch::Matchers::Contains("token id 131 at position 2"));
  CHECK_THROWS_WITH(h.engine.encode(bad.data(), 0, cache), Catch::Matchers::Contains("empty"));
  std::vector<std::int32_t> many(17, 5);
  CHECK_THROWS_WITH(h.engine.encode(many.data(), 17, cache), Catch::Matchers::Contains("capacity of 16"));
  cpu::KvCache big = h.engine.make_cache(300);
  std::vector<std::int32_t> toolong(257, 5);  // max_position_embeddings is 256
  CHECK_THROWS_WITH(h.engine.encode(toolong.data(), 257, big), Catch::Matchers::Contains("max_position_embeddings 256"));
}
