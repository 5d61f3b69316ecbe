// SPDX-License-Identifier: Apache-2.0
#include <limits>
#include <string>

#include <diffusion_gemma/io/config.hpp>

#include "support/catch.hpp"

using namespace diffusion_gemma;
using Catch::Matchers::Contains;
using io::Json;

namespace {

// config.json as transformers 5.x writes a tiny DiffusionGemma (per_layer_config spelling).
Json tiny_dg() {
  return Json::parse(R"({
    "architectures": ["DiffusionGemmaForBlockDiffusion"], "model_type": "diffusion_gemma",
    "canvas_length": 16, "tie_word_embeddings": true,
    "text_config": {
      "model_type": "diffusion_gemma_text", "vocab_size": 300, "hidden_size": 64,
      "intermediate_size": 96, "num_hidden_layers": 3, "num_attention_heads": 4,
      "num_key_value_heads": 2, "head_dim": 16, "hidden_activation": "gelu_pytorch_tanh",
      "max_position_embeddings": 512, "rms_norm_eps": 1e-06, "sliding_window": 8,
      "layer_types": ["sliding_attention", "sliding_attention", "full_attention"],
      "per_layer_config": {"2": {"head_dim": 32, "num_key_value_heads": 1}},
      "rope_parameters": {
        "full_attention": {"partial_rotary_factor": 0.25, "rope_theta": 1000000.0, "rope_type": "proportional"},
        "sliding_attention": {"rope_theta": 10000.0, "rope_type": "default"}},
      "num_experts": 4, "top_k_experts": 2, "moe_intermediate_size": 24,
      "pad_token_id": 0, "bos_token_id": 2, "eos_token_id": 1, "attention_bias": false,
      "use_bidirectional_attention": null, "tie_word_embeddings": true}})");
}

std::string error_of(const Json& j) {
  try {
    io::parse_model_config(j, "config.json");
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST_CASE("DiffusionGemma config.json parses into per-layer shapes", "[io][config]") {
  const ModelConfig c = io::parse_model_config(tiny_dg(), "config.json");
  CHECK(c.family == ModelFamily::kDiffusionGemma);
  CHECK(c.canvas_length == 16);
  REQUIRE(c.num_layers() == 3);
  CHECK(c.layers[0].type == LayerType::kSliding);
  CHECK(c.layers[0].head_dim == 16);
  CHECK(c.layers[0].num_kv_heads == 2);
  CHECK(c.layers[0].has_v_proj);
  CHECK(c.layers[2].type == LayerType::kFull);
  CHECK(c.layers[2].head_dim == 32);
  CHECK(c.layers[2].num_kv_heads == 1);
  CHECK_FALSE(c.layers[2].has_v_proj);  // k_eq_v on full layers
  CHECK(c.rope_full.type == RopeConfig::Type::kProportional);
  CHECK(c.rope_full.rotated_pairs(32) == 4);
  CHECK(c.rope_full.denominator(32) == 32);
  CHECK(c.rope_sliding.rotated_pairs(16) == 8);
  CHECK(c.final_logit_softcapping == 30.0f);  // DiffusionGemma's fixed value, not serialised by transformers
  CHECK(c.enable_moe_block);
  CHECK(c.num_experts == 4);
}

TEST_CASE("the model's dtype is the top level's, as transformers makes the whole model in it", "[io][config]") {
  Json j = tiny_dg();
  j["dtype"] = "float32";
  j["text_config"]["dtype"] = "bfloat16";
  CHECK(io::parse_model_config(j, "config.json").dtype == DType::kF32);
  j.erase("dtype");
  j["torch_dtype"] = "float16";  // the older spelling
  CHECK(io::parse_model_config(j, "config.json").dtype == DType::kF16);
  j.erase("torch_dtype");
  CHECK(io::parse_model_config(j, "config.json").dtype == DType::kBF16);  // only the nested one
}

TEST_CASE("released-checkpoint spelling: global_head_dim and num_global_key_value_heads", "[io][config]") {
  Json j = tiny_dg();
  j["text_config"].erase("per_layer_config");
  j["text_config"]["global_head_dim"] = 32;
  j["text_config"]["num_global_key_value_heads"] = 1;
  j["text_config"]["attention_k_eq_v"] = true;
  j["text_config"]["final_logit_softcapping"] = 30.0;
  const ModelConfig c = io::parse_model_config(j, "config.json");
  CHECK(c.layers[2].head_dim == 32);
  CHECK(c.layers[2].num_kv_heads == 1);
  CHECK(c.layers[1].head_dim == 16);

  j["text_config"].erase("global_head_dim");
  CHECK_THAT(error_of(j), Contains("missing required key 'text_config.global_head_dim'"));
}

// Two rules of transformers' config classes that a config.json does not show (both found by
// tools/reference/fuzz_configs.py, where transformers built weights of other shapes than ours).
TEST_CASE("transformers' implicit rules: DiffusionGemma's ungated global KV heads, the last layer full", "[io][config]") {
  Json j = tiny_dg();
  j["text_config"].erase("per_layer_config");
  j["text_config"]["global_head_dim"] = 32;
  j["text_config"]["num_global_key_value_heads"] = 1;
  // DiffusionGemma's config class does not declare attention_k_eq_v, so a false one does not gate
  // num_global_key_value_heads there (it does in Gemma 4's, which declares it).
  j["text_config"]["attention_k_eq_v"] = false;
  ModelConfig c = io::parse_model_config(j, "config.json");
  CHECK(c.layers[2].num_kv_heads == 1);
  CHECK_FALSE(c.layers[2].has_v_proj);
  Json g = j["text_config"];
  g["model_type"] = "gemma4_text";
  g["enable_moe_block"] = true;
  g["hidden_size_per_layer_input"] = 0;
  g["final_logit_softcapping"] = 30.0;
  c = io::parse_model_config(g, "config.json");
  CHECK(c.layers[2].num_kv_heads == 2);
  CHECK(c.layers[2].has_v_proj);

  // The last layer is full attention whatever layer_types says, with the full layers' shapes.
  j["text_config"]["layer_types"] = Json::array({"full_attention", "sliding_attention", "sliding_attention"});
  c = io::parse_model_config(j, "config.json");
  CHECK(c.layers[0].type == LayerType::kFull);
  CHECK(c.layers[1].type == LayerType::kSliding);
  CHECK(c.layers[2].type == LayerType::kFull);
  CHECK(c.layers[2].head_dim == 32);
  CHECK_FALSE(c.layers[2].has_v_proj);
  j["text_config"]["layer_types"] = Json::array({"sliding_attention", "sliding_attention", "sliding_attention"});
  c = io::parse_model_config(j, "config.json");
  CHECK(c.layers[2].type == LayerType::kFull);
  CHECK(c.layers[2].num_kv_heads == 1);

  // per_layer_config written as null: transformers derives no overrides from the global keys,
  // so the full layers keep head_dim and num_key_value_heads.
  Json null_plc = j;
  null_plc["text_config"]["per_layer_config"] = nullptr;
  c = io::parse_model_config(null_plc, "config.json");
  CHECK(c.layers[2].head_dim == 16);
  CHECK(c.layers[2].num_kv_heads == 2);
  // With no sliding layer, DiffusionGemma's text-level partial_rotary_factor reaches the full RoPE.
  Json all_full = j;
  all_full["text_config"]["layer_types"] = Json::array({"full_attention", "full_attention", "full_attention"});
  all_full["text_config"]["partial_rotary_factor"] = 0.5;
  all_full["text_config"]["rope_parameters"]["full_attention"].erase("partial_rotary_factor");
  CHECK(io::parse_model_config(all_full, "config.json").rope_full.partial_rotary_factor == 0.5);

  // DiffusionGemma ties its head by the top-level key alone: a text_config false is not read.
  j["text_config"]["tie_word_embeddings"] = false;
  CHECK(io::parse_model_config(j, "config.json").tie_word_embeddings);
  j["tie_word_embeddings"] = false;
  CHECK_THAT(error_of(j), Contains("config.json: tie_word_embeddings: an untied LM head"));
  // Gemma 4's nested config: refused when the text level unties it, and that key is named.
  Json n = j;
  n["model_type"] = "gemma4";
  n["tie_word_embeddings"] = true;
  n["text_config"]["model_type"] = "gemma4_text";
  n["text_config"]["enable_moe_block"] = true;
  n["text_config"]["hidden_size_per_layer_input"] = 0;
  n["text_config"]["final_logit_softcapping"] = 30.0;
  CHECK_THAT(error_of(n), Contains("text_config.tie_word_embeddings"));
}

TEST_CASE("plain Gemma 4 text config, MoE off, with v_proj on full layers", "[io][config]") {
  Json j = tiny_dg()["text_config"];
  j["model_type"] = "gemma4_text";
  j["enable_moe_block"] = false;
  j["attention_k_eq_v"] = false;
  j["hidden_size_per_layer_input"] = 0;
  j["final_logit_softcapping"] = 30.0;
  const ModelConfig c = io::parse_model_config(j, "config.json");
  CHECK(c.family == ModelFamily::kGemma4Text);
  CHECK_FALSE(c.enable_moe_block);
  CHECK(c.layers[2].has_v_proj);
  j["hidden_size_per_layer_input"] = 256;
  CHECK_THAT(error_of(j), Contains("hidden_size_per_layer_input") && Contains("PLE"));
  j["hidden_size_per_layer_input"] = 0;
  // Gemma 4's config fills a text-level partial_rotary_factor into a RoPE entry without one
  // (transformers' full-attention inv_freq then rotates half the pairs); an entry's own wins.
  Json partial = j;
  partial["partial_rotary_factor"] = 0.5;
  partial["rope_parameters"]["full_attention"].erase("partial_rotary_factor");
  CHECK(io::parse_model_config(partial, "config.json").rope_full.partial_rotary_factor == 0.5);
  partial["rope_parameters"]["full_attention"]["partial_rotary_factor"] = 0.25;
  CHECK(io::parse_model_config(partial, "config.json").rope_full.partial_rotary_factor == 0.25);
  // 0 would be divided by; null is Gemma 4's "no softcap".
  Json cap = j;
  cap["final_logit_softcapping"] = 0.0;
  CHECK_THAT(error_of(cap), Contains("final_logit_softcapping") && Contains("null for none"));
  cap["final_logit_softcapping"] = nullptr;
  CHECK(io::parse_model_config(cap, "config.json").final_logit_softcapping == 0.0f);
  Json shared = j;
  shared["num_kv_shared_layers"] = nullptr;
  CHECK_THAT(error_of(shared), Contains("num_kv_shared_layers") && Contains("null"));
  // rope_scaling would replace rope_parameters in transformers: refused by name, not ignored.
  Json scaling = j;
  scaling["rope_scaling"] = j["rope_parameters"];
  CHECK_THAT(error_of(scaling), Contains("config.json: rope_scaling") && Contains("rope_parameters"));
  j.erase("enable_moe_block");
  CHECK_THAT(error_of(j), Contains("enable_moe_block"));
}

TEST_CASE("config errors name the key at fault", "[io][config]") {
  Json j = tiny_dg();
  SECTION("missing key") {
    j["text_config"].erase("hidden_size");
    CHECK_THAT(error_of(j), Contains("missing required key 'text_config.hidden_size'"));
  }
  SECTION("wrong type") {
    j["text_config"]["num_hidden_layers"] = "three";
    CHECK_THAT(error_of(j), Contains("text_config.num_hidden_layers") && Contains("expected an integer"));
  }
  SECTION("zero layers") {
    j["text_config"]["num_hidden_layers"] = 0;
    CHECK_THAT(error_of(j), Contains("num_hidden_layers: must be at least 1"));
  }
  SECTION("heads not a multiple of KV heads") {
    j["text_config"]["num_key_value_heads"] = 3;
    CHECK_THAT(error_of(j), Contains("not a multiple of num_key_value_heads 3"));
  }
  SECTION("top-k larger than the number of experts") {
    j["text_config"]["top_k_experts"] = 5;
    CHECK_THAT(error_of(j), Contains("top_k_experts must be in 1..num_experts=4"));
  }
  SECTION("layer_types of the wrong length") {
    j["text_config"]["layer_types"] = Json::array({"full_attention"});
    CHECK_THAT(error_of(j), Contains("layer_types"));
  }
  SECTION("unsupported activation") {
    j["text_config"]["hidden_activation"] = "silu";
    CHECK_THAT(error_of(j), Contains("hidden_activation") && Contains("silu"));
  }
  SECTION("attention logit softcapping") {
    j["text_config"]["attn_logit_softcapping"] = 50.0;
    CHECK_THAT(error_of(j), Contains("attn_logit_softcapping"));
  }
  SECTION("unknown model type") {
    j["model_type"] = "llama";
    CHECK_THAT(error_of(j), Contains("model type 'llama' is not supported"));
  }
  SECTION("unknown RoPE type") {
    j["text_config"]["rope_parameters"]["full_attention"]["rope_type"] = "yarn";
    CHECK_THAT(error_of(j), Contains("rope_parameters.full_attention.rope_type") && Contains("yarn"));
  }
  SECTION("per_layer_config with a bad index") {
    j["text_config"]["per_layer_config"]["9"] = Json::object();
    CHECK_THAT(error_of(j), Contains("per_layer_config keys must be layer indices"));
  }
  SECTION("bidirectional text attention") {
    j["text_config"]["use_bidirectional_attention"] = "all";
    CHECK_THAT(error_of(j), Contains("use_bidirectional_attention"));
  }
  SECTION("a null final_logit_softcapping (transformers fails on it)") {
    j["text_config"]["final_logit_softcapping"] = nullptr;
    CHECK_THAT(error_of(j), Contains("final_logit_softcapping") && Contains("null"));
  }
  SECTION("a zero final_logit_softcapping (transformers divides by it)") {
    j["text_config"]["final_logit_softcapping"] = 0.0;
    CHECK_THAT(error_of(j), Contains("text_config.final_logit_softcapping") && Contains("divides"));
  }
  SECTION("a null RoPE factor (transformers computes with it)") {
    j["text_config"]["rope_parameters"]["full_attention"]["factor"] = nullptr;
    CHECK_THAT(error_of(j), Contains("rope_parameters.full_attention.factor") && Contains("null"));
  }
  SECTION("a null partial_rotary_factor in a RoPE entry") {
    j["text_config"]["rope_parameters"]["full_attention"]["partial_rotary_factor"] = nullptr;
    CHECK_THAT(error_of(j), Contains("rope_parameters.full_attention.partial_rotary_factor") && Contains("null"));
  }
  SECTION("a text-level partial_rotary_factor that would reach the sliding RoPE") {
    j["text_config"]["partial_rotary_factor"] = 0.5;
    CHECK_THAT(error_of(j), Contains("text_config.partial_rotary_factor") && Contains("sliding"));
    // The sliding entry's own factor keeps the text-level one away from it.
    j["text_config"]["rope_parameters"]["sliding_attention"]["partial_rotary_factor"] = 1.0;
    CHECK(error_of(j).empty());
  }
  SECTION("layers of one type with different shapes") {
    j["text_config"]["per_layer_config"]["0"] = Json::object({{"head_dim", 32}});
    CHECK_THAT(error_of(j), Contains("layer 1 (sliding attention)") && Contains("layer 0"));
  }
  SECTION("the forced last layer without the full layers' override") {
    j["text_config"]["layer_types"] = Json::array({"full_attention", "sliding_attention", "sliding_attention"});
    j["text_config"]["per_layer_config"] = Json::parse(R"({"0": {"head_dim": 32, "num_key_value_heads": 1}})");
    CHECK_THAT(error_of(j), Contains("layer 2 (full attention)"));
  }
  SECTION("sampler_config: arguments the sampler class does not take, no class") {
    const auto gen_error = [](const char* text) {
      try {
        io::parse_generation_config(Json::parse(text), "g.json");
      } catch (const Error& e) {
        return std::string(e.what());
      }
      return std::string();
    };
    CHECK_THAT(gen_error(R"({"sampler_config": {"_cls_name": "EntropyBoundSamplerConfig", "entropy_bound": 0.1, "top_k": 4}})"),
               Contains("sampler_config.top_k") && Contains("entropy_bound"));
    CHECK_THAT(gen_error(R"({"sampler_config": {"entropy_bound": 0.1}})"), Contains("sampler_config._cls_name"));
    CHECK(gen_error(R"({"sampler_config": {"_cls_name": "EntropyBoundSamplerConfig", "entropy_bound": 0.1}})").empty());
  }
  SECTION("rope_scaling beside rope_parameters") {
    j["text_config"]["rope_scaling"] = Json::object({{"rope_type", "default"}, {"rope_theta", 5.0}});
    CHECK_THAT(error_of(j), Contains("text_config.rope_scaling"));
  }
  SECTION("missing canvas_length") {
    j.erase("canvas_length");
    CHECK_THAT(error_of(j), Contains("canvas_length"));
  }
  SECTION("a number that is Inf or 0 in fp32") {
    j["text_config"]["rms_norm_eps"] = 1e300;
    CHECK_THAT(error_of(j), Contains("text_config.rms_norm_eps") && Contains("not representable in fp32"));
  }
  SECTION("a RoPE theta that underflows fp32") {
    j["text_config"]["rope_parameters"]["sliding_attention"]["rope_theta"] = 1e-300;
    CHECK_THAT(error_of(j), Contains("sliding_attention.rope_theta") && Contains("not representable in fp32"));
  }
  SECTION("a bos id outside the vocabulary") {
    j["text_config"]["bos_token_id"] = 100000;
    j["bos_token_id"] = 100000;
    CHECK_THAT(error_of(j), Contains("bos_token_id 100000 is outside the vocabulary"));
  }
  SECTION("an eos id outside the vocabulary is not an error") {
    // Generation stops on generation_config.json's ids; a model cut down from the released
    // config keeps its [1, 106] under a small vocabulary, and transformers loads it.
    j["text_config"]["eos_token_id"] = Json::array({1, 100000});
    j["eos_token_id"] = Json::array({1, 100000});
    CHECK(error_of(j).empty());
  }
  SECTION("an integer past int64") {
    j["text_config"]["hidden_size"] = Json(std::numeric_limits<std::uint64_t>::max());
    CHECK_THAT(error_of(j), Contains("text_config.hidden_size") && Contains("18446744073709551615 is out of range"));
  }
}

TEST_CASE("generation_config.json: values, nulls fall back to the reference defaults", "[io][config]") {
  const Json j = Json::parse(R"({"max_new_tokens": 512, "max_denoising_steps": null, "t_min": 0.3,
     "sampler_config": {"_cls_name": "EntropyBoundSamplerConfig", "entropy_bound": 0.2},
     "eos_token_id": [1, 106], "pad_token_id": 0, "stability_threshold": 2, "confidence_threshold": 0.01})");
  const GenerationConfig g = io::parse_generation_config(j, "generation_config.json");
  CHECK(g.max_new_tokens == 512);
  CHECK(g.max_denoising_steps == 48);
  CHECK(g.t_min == 0.3);
  CHECK(g.t_max == 0.8);
  CHECK(g.entropy_bound == 0.2);
  CHECK(g.stop_token_ids == std::vector<int>{1, 106});
  CHECK(g.stability_threshold == 2);

  const Json bad = Json::parse(R"({"t_min": 0.9, "t_max": 0.8})");
  CHECK_THROWS_WITH(io::parse_generation_config(bad, "g.json"), Contains("t_max must be > t_min"));
  // The file's step count has the command line's bound: a run that would never end is refused.
  const Json steps = Json::parse(R"({"max_denoising_steps": 2147483647})");
  CHECK_THROWS_WITH(io::parse_generation_config(steps, "g.json"), Contains("max_denoising_steps must be in [1, 1048576]"));
  const Json sampler = Json::parse(R"({"sampler_config": {"_cls_name": "TopKSampler"}})");
  CHECK_THROWS_WITH(io::parse_generation_config(sampler, "g.json"), Contains("TopKSampler"));
  // PAD and stop ids are bound to the model's vocabulary when both files are known
  // (io::load_checkpoint): PAD must be a token, since it is embedded after a stop id.
  GenerationConfig pad = io::parse_generation_config(Json::parse(R"({"pad_token_id": 300})"), "g.json");
  CHECK_NOTHROW(GenerationConfig(pad).restrict_to_vocabulary(301));
  CHECK_THROWS_WITH(pad.restrict_to_vocabulary(300), Contains("g.json: pad_token_id 300 is outside the vocabulary (vocab_size 300)"));
  // Stop ids outside the vocabulary can never be sampled: dropped and listed, not refused.
  GenerationConfig eos = io::parse_generation_config(Json::parse(R"({"eos_token_id": [1, -4, 299, 300]})"), "g.json");
  eos.restrict_to_vocabulary(300);
  CHECK(eos.stop_token_ids == std::vector<int>{1, 299});
  CHECK(eos.ignored_stop_token_ids == std::vector<int>{-4, 300});
  // The released set under a vocabulary smaller than the released one (a cut-down test model).
  GenerationConfig small = io::parse_generation_config(Json::parse(R"({"eos_token_id": [1, 106, 50]})"), "g.json");
  small.restrict_to_vocabulary(100);
  CHECK(small.stop_token_ids == std::vector<int>{1, 50});
  CHECK(small.ignored_stop_token_ids == std::vector<int>{106});
  // No key at all: transformers' reading, which does not fall back to config.json's eos_token_id:
  // no stop id, no PAD (tokens after a stop id stay), no max_length.
  const GenerationConfig d = io::parse_generation_config(Json::object(), "g.json");
  CHECK(d.stop_token_ids.empty());
  CHECK(d.pad_token_id == kNoPadToken);
  CHECK(d.max_length == 0);
  CHECK_NOTHROW(GenerationConfig(d).restrict_to_vocabulary(100));
  // null and [] are absent too.
  const GenerationConfig n =
      io::parse_generation_config(Json::parse(R"({"eos_token_id": [], "pad_token_id": null, "max_length": null})"), "g.json");
  CHECK(n.stop_token_ids.empty());
  CHECK(n.pad_token_id == kNoPadToken);
  CHECK(n.max_length == 0);
  const GenerationConfig m = io::parse_generation_config(Json::parse(R"({"max_length": 300})"), "g.json");
  CHECK(m.max_length == 300);
  CHECK_THROWS_WITH(io::parse_generation_config(Json::parse(R"({"max_length": 0})"), "g.json"),
                    Contains("g.json: max_length") && Contains("must be positive"));
  CHECK_THROWS_WITH(io::parse_generation_config(Json::parse(R"({"pad_token_id": -1})"), "g.json"),
                    Contains("g.json: pad_token_id") && Contains("must be >= 0"));
  CHECK_THROWS_WITH(io::parse_generation_config(Json::parse(R"({"max_length": "x"})"), "g.json"),
                    Contains("max_length"));
}
