// SPDX-License-Identifier: Apache-2.0
// Binding checkpoint tensors to the backbone: every expected tensor present with its shape and
// dtype; missing, misshapen and unexpected tensors reported by name; vision tensors ignored;
// encoder/decoder layer_scalar copies equal; NaN/Inf found on request.
#include <cmath>
#include <cstring>
#include <fstream>
#include <limits>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include <diffusion_gemma/core/bfloat16.hpp>
#include <diffusion_gemma/io/config.hpp>
#include <diffusion_gemma/io/load.hpp>
#include <diffusion_gemma/io/safetensors.hpp>
#include <diffusion_gemma/io/safetensors_writer.hpp>
#include <diffusion_gemma/io/trace_json.hpp>
#include <diffusion_gemma/io/weights.hpp>

#include "support/catch.hpp"
#include "support/edited_checkpoint.hpp"
#include "support/paths.hpp"

using namespace diffusion_gemma;
using Catch::Matchers::Contains;


TEST_CASE("a transformers checkpoint binds completely; vision tensors are ignored and counted", "[io][weights]") {
  const io::Checkpoint c(dg_test::fixture("dg_small"));
  const ModelConfig cfg = io::load_model_config(dg_test::fixture("dg_small"));
  io::BindReport report;
  const ModelWeights w = io::bind_weights(c, cfg, &report);
  CHECK(report.prefix == "model.decoder.");
  CHECK(report.ignored_vision > 0);
  CHECK_THAT(report.summary(), Contains("vision-tower"));
  REQUIRE(w.layers.size() == 4);
  CHECK(w.layers[0].v_proj.shape == Shape{2 * 12, 48});
  CHECK(w.layers[1].v_proj.empty());  // full layer: k_eq_v
  CHECK(w.layers[1].q_proj.shape == Shape{4 * 24, 48});
  CHECK(w.self_conditioning.present());

  const io::Checkpoint g(dg_test::fixture("gemma4_dense"));
  const ModelConfig gcfg = io::load_model_config(dg_test::fixture("gemma4_dense"));
  io::BindReport greport;
  const ModelWeights gw = io::bind_weights(g, gcfg, &greport);
  CHECK(greport.prefix == "model.");
  CHECK_FALSE(gw.layers[2].v_proj.empty());  // attention_k_eq_v false: v_proj on the full layer too
  CHECK(gw.layers[0].experts_gate_up.empty());
}

TEST_CASE("binding reports missing, misshapen and unexpected tensors by name", "[io][weights]") {
  SECTION("missing") {
    const dg_test::EditedCheckpoint e("w_missing", {}, {"model.decoder.layers.2.mlp.up_proj.weight"}, {});
    CHECK_THAT(e.bind_error(), Contains("missing tensors (1)") && Contains("model.decoder.layers.2.mlp.up_proj.weight [80, 48]"));
  }
  SECTION("misshapen") {
    const dg_test::EditedCheckpoint e("w_shape", {{"model.decoder.norm.weight", std::vector<float>(47, 1.0f)}}, {}, {});
    CHECK_THAT(e.bind_error(), Contains("model.decoder.norm.weight: shape [47], expected [48]"));
  }
  SECTION("unexpected") {
    const dg_test::EditedCheckpoint e("w_extra", {}, {}, {{"model.decoder.layers.0.self_attn.q_bias", Shape{48}}});
    CHECK_THAT(e.bind_error(), Contains("unexpected tensors (1)") && Contains("q_bias"));
  }
  SECTION("encoder and decoder layer scalars disagree") {
    const dg_test::EditedCheckpoint e("w_scalar", {{"model.encoder.language_model.layers.3.layer_scalar", {0.125f}}}, {}, {});
    CHECK_THAT(e.bind_error(), Contains("model.encoder.language_model.layers.3.layer_scalar = 0.125 differs"));
  }
  SECTION("all problems at once") {
    const dg_test::EditedCheckpoint e("w_many", {{"model.decoder.norm.weight", std::vector<float>(47, 1.0f)}},
                             {"model.decoder.embed_tokens.weight"}, {{"model.decoder.extra", Shape{2}}});
    const std::string msg = e.bind_error();
    CHECK_THAT(msg, Contains("missing tensors") && Contains("wrong shape or dtype") && Contains("unexpected tensors"));
  }
}

TEST_CASE("--check-weights finds a non-finite weight and names it", "[io][weights]") {
  std::vector<float> w(48, 1.0f);
  w[7] = std::numeric_limits<float>::quiet_NaN();
  const dg_test::EditedCheckpoint e("w_nan", {{"model.decoder.layers.1.input_layernorm.weight", w}}, {}, {});
  const io::Checkpoint c(e.dir);
  CHECK_THROWS_WITH(io::check_weights_finite(c), Contains("model.decoder.layers.1.input_layernorm.weight") &&
                                                     Contains("flat index 7"));
  CHECK_NOTHROW(io::check_weights_finite(io::Checkpoint(dg_test::fixture("dg_small"))));
}

// The trace holds a line for every canvas the summary counts: a canvas cancelled while denoising
// reaches no on_commit, so write_summary writes it first.
TEST_CASE("TraceWriter: a cancelled canvas gets its line before the summary", "[io][trace]") {
  const std::string path = dg_test::temp_dir("trace") + "/trace.jsonl";
  GenerationResult r;
  r.tokens.assign(8, 5);
  r.tokens[2] = 1;  // a stop id in the committed canvas
  r.canvases.resize(2);
  r.canvases[0].length = 8;
  r.canvases[0].valid_tokens = 3;
  r.canvases[0].stop_token = true;
  r.canvases[1].canvas = 1;
  r.canvases[1].position = 8;
  r.canvases[1].length = 8;
  r.canvases[1].stop = CanvasStop::kCancelled;
  r.forwards = 5;
  {
    io::TraceWriter w(path);
    w.write(StepRecord{});
    w.write(r.canvases[0]);  // what on_commit sees
    w.write_summary(r);
  }
  std::ifstream in(path);
  std::vector<nlohmann::json> lines;
  for (std::string line; std::getline(in, line);) lines.push_back(nlohmann::json::parse(line));
  REQUIRE(lines.size() == 4);
  CHECK(lines[1]["type"] == "canvas");
  CHECK(lines[2]["type"] == "canvas");
  CHECK(lines[2]["canvas"] == 1);
  CHECK(lines[2]["stop"] == "cancelled");
  CHECK(lines[3]["type"] == "summary");
  CHECK(lines[3]["canvases"] == 2);
  CHECK(lines[3]["tokens"] == 8);
  CHECK(lines[3]["text_tokens"] == 3);
}

namespace {

// dg_small with config.json's dtype set to `dtype` and its F32 tensors stored as `stored`.
std::string dtype_variant(const std::string& name, const std::string& dtype, DType stored) {
  const std::string dir = dg_test::temp_dir(name);
  const std::string src = dg_test::fixture("dg_small");
  nlohmann::json cfg = nlohmann::json::parse(std::ifstream(src + "/config.json"));
  cfg.erase("torch_dtype");
  cfg["dtype"] = dtype;
  std::ofstream(dir + "/config.json") << cfg.dump();
  std::ofstream(dir + "/generation_config.json") << std::ifstream(src + "/generation_config.json").rdbuf();
  const io::SafetensorsFile file(src + "/model.safetensors");
  io::SafetensorsWriter w;
  std::vector<std::vector<std::uint16_t>> keep;
  for (const auto& e : file.entries()) {
    if (e.tensor.dtype != DType::kF32 || stored == DType::kF32) {
      w.add(e.name, e.tensor.dtype, e.tensor.shape, e.tensor.data);
      continue;
    }
    std::vector<std::uint16_t>& bits = keep.emplace_back(static_cast<std::size_t>(e.tensor.shape.numel()));
    for (std::size_t i = 0; i < bits.size(); ++i) {
      bits[i] = bfloat16::from_float(load_as_float(e.tensor, static_cast<std::int64_t>(i))).bits;
    }
    w.add(e.name, DType::kBF16, e.tensor.shape, bits.data());
  }
  w.write(dir + "/model.safetensors");
  return dir;
}

std::vector<Weight> all_weights(const io::LoadedCheckpoint& c) {
  std::vector<Weight> out;
  for_each_parameter(c.config, c.weights, [&](const ParamSpec&, const Weight& w) { out.push_back(w); });
  return out;
}

}  // namespace

TEST_CASE("the model's dtype is config.json's, as transformers' dtype=\"auto\" makes it", "[io][weights]") {
  const int hidden = io::load_model_config(dg_test::fixture("dg_small")).hidden_size;
  const io::LoadedCheckpoint bf16 = io::load_checkpoint(dtype_variant("dtype_bf16", "bfloat16", DType::kBF16));
  // An F32 file whose config says bfloat16 (a model saved in F32 with its dtype left as it was):
  // its tensors were used unrounded and its embedding scale was F32's, unlike transformers'.
  const io::LoadedCheckpoint wide = io::load_checkpoint(dtype_variant("dtype_f32_as_bf16", "bfloat16", DType::kF32));
  CHECK(bf16.embed_scale == round_to_bfloat16(std::sqrt(static_cast<float>(hidden))));
  CHECK(wide.embed_scale == bf16.embed_scale);
  const std::vector<Weight> a = all_weights(bf16), b = all_weights(wide);
  REQUIRE(a.size() == b.size());
  for (std::size_t i = 0; i < a.size(); ++i) {
    INFO("parameter " << i);
    if (a[i].empty()) {
      CHECK(b[i].empty());
      continue;
    }
    REQUIRE(b[i].dtype == DType::kBF16);
    CHECK(b[i].shape == a[i].shape);
    CHECK(std::memcmp(a[i].data, b[i].data, static_cast<std::size_t>(a[i].shape.numel()) * 2) == 0);
  }
  // The other way round a float32 model holds every BF16 value exactly: the weights stay in place,
  // and the scale is F32's.
  const io::LoadedCheckpoint narrow = io::load_checkpoint(dtype_variant("dtype_bf16_as_f32", "float32", DType::kBF16));
  CHECK(narrow.embed_scale == std::sqrt(static_cast<float>(hidden)));
  CHECK(narrow.weights.embed_tokens.dtype == DType::kBF16);
  CHECK(narrow.weights.embed_tokens.borrowed());
}
