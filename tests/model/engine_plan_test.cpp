// SPDX-License-Identifier: Apache-2.0
// The host-side logic both engines share, testable without a GPU: the RoPE tables the CUDA engine
// uploads, the encoder's chunk plan and the workspace rows of a request, the device token-id check
// (its predicate and error word), and the KV cache compatibility check.
#include <cstdint>
#include <cstring>
#include <vector>

#include <diffusion_gemma/core/math.hpp>
#include <diffusion_gemma/model/kv_layout.hpp>
#include <diffusion_gemma/model/pass_plan.hpp>
#include <diffusion_gemma/model/rope_table.hpp>
#include <diffusion_gemma/model/token_id_check.hpp>

#include "support/catch.hpp"

using namespace diffusion_gemma;

namespace {

// Gemma 4's shape of RoPE: sliding layers default RoPE on head_dim 12, full layers proportional
// RoPE (partial, theta 1e6) on head_dim 24.
ModelConfig two_rope_config() {
  ModelConfig c;
  c.source = "two_rope";
  c.rope_sliding.theta = 10000.0;
  c.rope_full.type = RopeConfig::Type::kProportional;
  c.rope_full.theta = 1e6;
  c.rope_full.partial_rotary_factor = 0.25;
  for (LayerType t : {LayerType::kSliding, LayerType::kSliding, LayerType::kFull, LayerType::kSliding, LayerType::kFull}) {
    LayerSpec s;
    s.type = t;
    s.head_dim = t == LayerType::kFull ? 24 : 12;
    s.num_kv_heads = t == LayerType::kFull ? 1 : 2;
    c.layers.push_back(s);
  }
  return c;
}

bool same_bits(float a, float b) { return std::memcmp(&a, &b, sizeof a) == 0; }

}  // namespace

TEST_CASE("RoPE tables: one per layer type, math::rope_inv_freq's bits", "[model][rope]") {
  const ModelConfig c = two_rope_config();
  const RopeTables t = RopeTables::build(c);
  REQUIRE(t.layer_offset.size() == c.layers.size());
  CHECK(t.inv_freq.size() == 6 + 12);  // deduplicated: one sliding table, one full table
  CHECK(t.layer_offset[0] == t.layer_offset[1]);
  CHECK(t.layer_offset[0] == t.layer_offset[3]);
  CHECK(t.layer_offset[2] == t.layer_offset[4]);
  CHECK(t.layer_offset[0] != t.layer_offset[2]);
  for (int l = 0; l < c.num_layers(); ++l) {
    const LayerSpec& s = c.layers[static_cast<std::size_t>(l)];
    const RopeConfig& r = c.rope(s.type);
    const float* inv = t.layer(l);
    for (int i = 0; i < s.head_dim / 2; ++i) {
      const float want = math::rope_inv_freq(i, r.rotated_pairs(s.head_dim), r.denominator(s.head_dim),
                                             static_cast<float>(r.theta), static_cast<float>(r.factor));
      INFO("layer " << l << " pair " << i);
      CHECK(same_bits(inv[i], want));
    }
  }
  // Proportional RoPE on 24 dims with factor 0.25 rotates 3 of 12 pairs; the rest stay unrotated.
  const float* full = t.layer(2);
  CHECK(full[2] > 0.0f);
  CHECK(full[3] == 0.0f);
  CHECK(full[11] == 0.0f);
  // The angle is one fp32 product of the position (as a float) and the table entry.
  CHECK(same_bits(math::rope_angle(60000, full[1]), 60000.0f * full[1]));
}

TEST_CASE("the encoder chunk plan: passes of max_pass_tokens, a shorter last one", "[model][passes]") {
  std::vector<std::int64_t> lengths;
  for (std::int64_t done = 0; done < 7;) {
    lengths.push_back(encoder_pass_tokens(7, done, 3));
    done += lengths.back();
  }
  CHECK(lengths == std::vector<std::int64_t>{3, 3, 1});
  CHECK(encoder_pass_count(7, 3) == 3);
  CHECK(encoder_pass_count(6, 3) == 2);
  CHECK(encoder_pass_count(2, 256) == 1);
  CHECK(encoder_pass_count(0, 3) == 0);
  CHECK(encoder_pass_count(5000, 256) == 20);
  CHECK_THROWS_WITH(check_max_pass_tokens(0, "EngineOptions::max_pass_tokens"),
                    Catch::Matchers::Contains("EngineOptions::max_pass_tokens 0 must be positive"));
  check_max_pass_tokens(1, "EngineOptions::max_pass_tokens");
}

TEST_CASE("workspace rows of a request: an encoder chunk or a canvas, never the whole prompt", "[model][passes]") {
  CHECK(request_pass_rows(5000, 256, 256) == 256);
  CHECK(request_pass_rows(5000, 32, 256) == 256);  // the prompt's chunks are the largest pass
  CHECK(request_pass_rows(5000, 256, 3) == 256);   // the canvas is
  CHECK(request_pass_rows(10, 8, 256) == 10);      // a short prompt is one pass
  CHECK(request_pass_rows(2, 8, 256) == 8);
}

TEST_CASE("device token-id check: predicate and first-bad-position error word", "[model][token_ids]") {
  CHECK(token_id_in_vocabulary(0, 131));
  CHECK(token_id_in_vocabulary(130, 131));
  CHECK_FALSE(token_id_in_vocabulary(131, 131));
  CHECK_FALSE(token_id_in_vocabulary(-1, 131));
  CHECK_FALSE(token_id_in_vocabulary(-2147483647 - 1, 131));

  const BadTokenWord a = bad_token_record(5, 131), b = bad_token_record(2, -7), c = bad_token_record(2147483646, 999);
  CHECK(bad_token_position(a) == 5);
  CHECK(bad_token_id(a) == 131);
  CHECK(bad_token_position(b) == 2);
  CHECK(bad_token_id(b) == -7);  // negative ids survive the packing
  CHECK(bad_token_position(c) == 2147483646);
  CHECK(c != kNoBadToken);
  // Merged in any order (as the device's atomicMin does), the lowest position wins.
  BadTokenWord w = kNoBadToken;
  for (BadTokenWord r : {c, a, b}) w = first_bad_token(w, r);
  CHECK(w == b);
  CHECK(first_bad_token(first_bad_token(kNoBadToken, b), a) == first_bad_token(a, first_bad_token(b, kNoBadToken)));

  CHECK(bad_token_status(kNoBadToken, 131, "pass").ok());
  const Status s = bad_token_status(a, 131, "a device pass");
  CHECK(s.code() == StatusCode::kOutOfRange);
  CHECK_THAT(s.message(), Catch::Matchers::Contains("a device pass: token id 131 at position 5") &&
                              Catch::Matchers::Contains("[0, 131)"));
}

TEST_CASE("KV cache compatibility names the first mismatch", "[model][kv_cache]") {
  const ModelConfig c = two_rope_config();
  CHECK(check_kv_cache_layout(KvCacheLayout::of(c, DType::kBF16), c, DType::kBF16).ok());

  ModelConfig fewer = c;
  fewer.layers.pop_back();
  Status s = check_kv_cache_layout(KvCacheLayout::of(fewer, DType::kBF16), c, DType::kBF16);
  CHECK(s.code() == StatusCode::kInvalidArgument);
  CHECK_THAT(s.message(), Catch::Matchers::Contains("KV cache has 4 layers") &&
                              Catch::Matchers::Contains("(two_rope) has 5"));

  KvCacheLayout heads = KvCacheLayout::of(c, DType::kF32);
  heads.layers[2].kv_heads = 2;
  s = check_kv_cache_layout(heads, c, DType::kF32);
  CHECK_THAT(s.message(), Catch::Matchers::Contains("layer 2 holds 2 KV heads of head_dim 24") &&
                              Catch::Matchers::Contains("has 1 of head_dim 24"));

  KvCacheLayout dims = KvCacheLayout::of(c, DType::kF32);
  dims.layers[0].head_dim = 16;
  CHECK_THAT(check_kv_cache_layout(dims, c, DType::kF32).message(),
             Catch::Matchers::Contains("layer 0 holds 2 KV heads of head_dim 16"));

  s = check_kv_cache_layout(KvCacheLayout::of(c, DType::kF32), c, DType::kBF16);
  CHECK(s.code() == StatusCode::kInvalidArgument);
  CHECK_THAT(s.message(), Catch::Matchers::Contains("KV cache stores F32 but the engine stores K/V in BF16"));
  CHECK_FALSE(check_kv_cache_layout(KvCacheLayout{}, c, DType::kF32).ok());  // a default-constructed cache
}
