// SPDX-License-Identifier: Apache-2.0
// Quantized checkpoints (docs/quantization.md): the fixtures in tests/fixtures/quant were written
// by compressed-tensors 0.20.1 and GPTQModel 7.7.0 (tools/reference/make_quant_fixtures.py) and, for
// llmc_*, by llm-compressor 0.14.0.1's model_free_ptq (tools/reference/make_llmcompressor_fixture.py),
// with `dequantized.safetensors` holding compressed-tensors' / GPTQModel's own dequantisation of
// three matrices. Here:
// our dequantisation equals theirs bit for bit; our RTN quantiser writes the same tensors as
// compressed-tensors from the same BF16 weights; quantization_config refusals name the key; bad
// tensors are refused before anything computes, naming the tensor.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <random>
#include <string>
#include <vector>

#include <unistd.h>

#include <diffusion_gemma/cpu/kernels/dequantize.hpp>
#include <diffusion_gemma/io/load.hpp>
#include <diffusion_gemma/io/quantization_config.hpp>
#include <diffusion_gemma/io/quantize.hpp>
#include <diffusion_gemma/io/safetensors.hpp>
#include <diffusion_gemma/io/safetensors_writer.hpp>

#include "support/catch.hpp"
#include "support/golden.hpp"
#include "support/paths.hpp"

using namespace diffusion_gemma;
using Catch::Matchers::Contains;

namespace {

// llmc_*: written by llm-compressor 0.14.0.1 itself (model_free_ptq), tools/reference/make_llmcompressor_fixture.py.
const char* const kVariants[] = {"fp8_channel",   "fp8_tensor",    "int8_channel", "w4a16_g32",
                                 "w4a16_asym_g64", "w8a16_channel", "gptq_sym",     "gptq_asym_descact", "gptq_dynamic",
                                 "llmc_w4a16",     "llmc_fp8_dynamic"};

std::string quant_fixture(const std::string& name) { return dg_test::fixture("quant/" + name); }

// Every element of an [out, in] weight as float: dequantised, or widened when stored plain.
std::vector<float> dense_values(const Weight& w) {
  std::vector<float> out(static_cast<std::size_t>(w.rows() * w.cols()));
  if (w.is_quantized()) {
    const QuantizedMatrix& q = *w.quant;
    std::vector<std::byte> buf(static_cast<std::size_t>(q.rows * q.cols) * dtype_size(q.scale_dtype()));
    cpu::kernels::dequantize_rows(q, 0, q.rows, buf.data());
    RawTensor t;
    t.data = buf.data();
    t.dtype = q.scale_dtype();
    t.shape = Shape{q.rows, q.cols};
    for (std::size_t i = 0; i < out.size(); ++i) out[i] = load_as_float(t, static_cast<std::int64_t>(i));
  } else {
    REQUIRE(w.is_dense());
    for (std::size_t i = 0; i < out.size(); ++i) out[i] = w.at(static_cast<std::int64_t>(i));
  }
  return out;
}

std::string load_error(const std::string& dir) {
  try {
    io::load_checkpoint(dir);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

// A copy of a fixture with tensors dropped, I32 tensors set (replaced or added) and config.json's
// text replaced where asked.
struct EditedFixture {
  std::string dir;
  EditedFixture(const std::string& variant, const std::map<std::string, std::vector<std::int32_t>>& replace_i32,
                const std::vector<std::string>& drop, const std::string& config_from = "", const std::string& config_to = "") {
    dir = dg_test::temp_dir("quant_" + variant);
    const std::string src = quant_fixture(variant);
    std::string config = io::read_text_file(src + "/config.json");
    if (!config_from.empty()) {
      const auto at = config.find(config_from);
      REQUIRE(at != std::string::npos);
      config.replace(at, config_from.size(), config_to);
    }
    std::ofstream(dir + "/config.json") << config;
    std::ofstream(dir + "/generation_config.json") << io::read_text_file(src + "/generation_config.json");
    const io::Checkpoint ckpt(src);
    io::SafetensorsWriter w;
    for (const std::string& name : ckpt.names()) {
      if (std::find(drop.begin(), drop.end(), name) != drop.end() || replace_i32.count(name)) continue;
      const RawTensor& t = ckpt.find(name)->tensor;
      w.add(name, t.dtype, t.shape, t.data);
    }
    for (const auto& [name, values] : replace_i32) w.add(name, Shape{static_cast<std::int64_t>(values.size())}, values.data());
    w.write(dir + "/model.safetensors");
  }
};

}  // namespace

TEST_CASE("quantized fixtures bind, and dequantise bit for bit as compressed-tensors and GPTQModel do",
          "[io][quant]") {
  for (const char* v : kVariants) {
    INFO(v);
    io::LoadedCheckpoint c = io::load_checkpoint(quant_fixture(v));
    CHECK(c.quantization.quantized());
    CHECK(!c.report.quantized.empty());
    const io::SafetensorsFile want(quant_fixture(v) + "/dequantized.safetensors");
    const std::string& pre = c.report.prefix;
    const LayerWeights& L0 = c.weights.layers[0];
    const LayerWeights& L1 = c.weights.layers[1];
    const std::int64_t Im = c.config.moe_intermediate_size, H = c.config.hidden_size;
    CHECK(L0.q_proj.is_quantized());
    CHECK(dense_values(L0.q_proj) == dg_test::floats(want, pre + "layers.0.self_attn.q_proj.weight"));
    CHECK(dense_values(L1.mlp_down) == dg_test::floats(want, pre + "layers.1.mlp.down_proj.weight"));
    // Expert 1's down projection: split (its own matrix) or fused (slice 1 of the BF16 tensor).
    const Weight down1 = L0.experts_down.group(1);
    REQUIRE(down1.rows() == H);
    REQUIRE(down1.cols() == Im);
    const std::string expert_name = pre + "layers.0.experts.1.down_proj.weight";
    CHECK(dense_values(down1) == dg_test::floats(want, expert_name));
    CHECK(c.report.split_experts == (std::string(v) != "int8_channel"));
    // The router, norms, embedding and self-conditioning stay plain, as the ignore lists say.
    CHECK(L0.router_proj.is_dense());
    CHECK(c.weights.embed_tokens.is_dense());
    CHECK(c.weights.self_conditioning.gate_proj.is_dense());
  }
}

// llm-compressor's model_free_ptq writes a model.safetensors.index.json even for one shard, no
// safetensors metadata, and config groups with every QuantizationArgs field (observer, scale_dtype,
// zp_dtype, block_structure, actorder: null); FP8_DYNAMIC keeps its preset name as the group name
// and its dynamic per-token input_activations.
TEST_CASE("checkpoints written by llm-compressor's model_free_ptq load", "[io][quant]") {
  const io::LoadedCheckpoint w4 = io::load_checkpoint(quant_fixture("llmc_w4a16"));
  CHECK(w4.quantization.describe() == "compressed-tensors: config_group_0 = int4 group 32 symmetric (pack-quantized)");
  CHECK(w4.report.prefix == "model.decoder.");
  CHECK(w4.report.split_experts);
  const io::LoadedCheckpoint f8 = io::load_checkpoint(quant_fixture("llmc_fp8_dynamic"));
  CHECK(f8.quantization.describe() == "compressed-tensors: FP8_DYNAMIC = fp8 e4m3 per channel (float-quantized)");
  CHECK(f8.report.split_experts);
  // Every Linear of the text model quantized: attention (q, k, v, o; the full layer has no v_proj),
  // MLP (3) and experts (3 x 4): 4 + 3 + 2 x (3 + 12) = 37.
  const auto total = [](const io::LoadedCheckpoint& c) {
    std::size_t n = 0;
    for (const auto& [scheme, count] : c.report.quantized) n += count;
    return n;
  };
  CHECK(total(w4) == 37);
  CHECK(total(f8) == 37);
}

// make_quant_fixtures.py re-implements model_free_ptq with compressed-tensors 0.20.1 (llm-compressor
// cannot be installed next to the reference's torch/transformers). On the same BF16 weights,
// llm-compressor itself (with compressed-tensors 0.19.0) wrote the same tensors, byte for byte.
TEST_CASE("llm-compressor's own output equals the re-implemented fixtures byte for byte", "[io][quant]") {
  struct Pair {
    const char* llmc;
    const char* ours;
    const char* our_prefix;
  };
  for (const Pair& p : {Pair{"llmc_fp8_dynamic", "fp8_channel", "model.decoder."},
                        Pair{"llmc_w4a16", "w4a16_g32", "model.encoder.language_model."}}) {
    INFO(p.llmc << " vs " << p.ours);
    const io::Checkpoint theirs(quant_fixture(p.llmc));
    const io::Checkpoint ours(quant_fixture(p.ours));
    int compared = 0;
    for (const std::string& name : theirs.names()) {
      INFO(name);
      std::string mapped = name;
      const std::string dec = "model.decoder.";
      if (mapped.rfind(dec, 0) == 0) mapped = p.our_prefix + mapped.substr(dec.size());
      const auto* b = ours.find(mapped);
      REQUIRE(b != nullptr);
      const RawTensor& x = theirs.find(name)->tensor;
      const RawTensor& y = b->tensor;
      CHECK(x.dtype == y.dtype);
      CHECK(x.shape == y.shape);
      REQUIRE(x.nbytes == y.nbytes);
      CHECK(std::memcmp(x.data, y.data, x.nbytes) == 0);
      ++compared;
    }
    CHECK(compared > 100);
  }
}

TEST_CASE("text weights bind under model.encoder.language_model. as well as model.decoder.", "[io][quant]") {
  const io::LoadedCheckpoint c = io::load_checkpoint(quant_fixture("w4a16_g32"));
  CHECK(c.report.prefix == "model.encoder.language_model.");
  const io::LoadedCheckpoint d = io::load_checkpoint(quant_fixture("w4a16_asym_g64"));
  CHECK(d.report.prefix == "model.decoder.");
}

TEST_CASE("our round-to-nearest quantiser writes what compressed-tensors writes from the same BF16 weights",
          "[io][quant]") {
  const io::Checkpoint base(quant_fixture("base"));
  struct Case {
    const char* variant;
    io::QuantScheme scheme;
    std::int64_t group;
    bool symmetric;
  };
  const Case cases[] = {{"fp8_channel", io::QuantScheme::kFp8, 0, true},
                        {"int8_channel", io::QuantScheme::kInt8, 0, true},
                        {"w4a16_g32", io::QuantScheme::kW4A16, 32, true},
                        {"w4a16_asym_g64", io::QuantScheme::kW4A16, 64, false},
                        {"w8a16_channel", io::QuantScheme::kW8A16, 0, true}};
  for (const Case& k : cases) {
    INFO(k.variant);
    const io::Checkpoint q(quant_fixture(k.variant));
    const io::LoadedCheckpoint loaded = io::load_checkpoint(quant_fixture(k.variant));
    io::QuantizeSpec spec;
    spec.scheme = k.scheme;
    spec.group_size = k.group;
    spec.symmetric = k.symmetric;
    spec.scale_dtype = DType::kBF16;
    for (const char* module : {"layers.0.self_attn.q_proj", "layers.1.mlp.down_proj", "layers.0.self_attn.o_proj"}) {
      INFO(module);
      const RawTensor& w = base.find(std::string("model.decoder.") + module + ".weight")->tensor;
      std::vector<float> rows(static_cast<std::size_t>(w.shape.numel()));
      for (std::size_t i = 0; i < rows.size(); ++i) rows[i] = load_as_float(w, static_cast<std::int64_t>(i));
      for (const io::QuantizedTensor& t : io::quantize_matrix(rows.data(), w.shape[0], w.shape[1], spec)) {
        const std::string name = loaded.report.prefix + module + t.suffix;
        INFO(name);
        const io::SafetensorsEntry* e = q.find(name);
        REQUIRE(e != nullptr);
        CHECK(e->tensor.dtype == t.dtype);
        CHECK(e->tensor.shape == t.shape);
        REQUIRE(e->tensor.nbytes == t.bytes.size());
        CHECK(std::memcmp(e->tensor.data, t.bytes.data(), t.bytes.size()) == 0);
      }
    }
  }
}

TEST_CASE("quantize then dequantise stays within half a step of every weight (a step when asymmetric)", "[io][quant]") {
  std::mt19937 gen(5);
  std::normal_distribution<float> normal(0.0f, 0.05f);
  const std::int64_t out = 13, in = 96;
  std::vector<float> w(static_cast<std::size_t>(out * in));
  for (float& x : w) x = round_to_bfloat16(normal(gen));
  w[5] = 0.0f;
  for (std::int64_t c = 0; c < in; ++c) w[static_cast<std::size_t>(2 * in + c)] = 0.0f;  // an all-zero row
  for (io::QuantScheme s : {io::QuantScheme::kW4A16, io::QuantScheme::kW8A16, io::QuantScheme::kInt8, io::QuantScheme::kFp8}) {
    for (bool symmetric : {true, false}) {
      if (!symmetric && (s == io::QuantScheme::kInt8 || s == io::QuantScheme::kFp8)) continue;
      for (std::int64_t group : {std::int64_t{0}, std::int64_t{32}}) {
        INFO(io::quant_scheme_name(s) << " symmetric " << symmetric << " group " << group);
        io::QuantizeSpec spec;
        spec.scheme = s;
        spec.group_size = group;
        spec.symmetric = symmetric;
        const auto tensors = io::quantize_matrix(w.data(), out, in, spec);
        QuantizedMatrix q;
        q.format = s == io::QuantScheme::kFp8 ? QuantFormat::kFp8
                   : s == io::QuantScheme::kInt8 ? QuantFormat::kInt8
                                                 : QuantFormat::kPacked;
        q.bits = spec.bits();
        q.rows = out;
        q.cols = in;
        q.group_size = group;
        const auto raw = [](const io::QuantizedTensor& t) {
          RawTensor r;
          r.data = reinterpret_cast<const std::byte*>(t.bytes.data());
          r.dtype = t.dtype;
          r.shape = t.shape;
          r.nbytes = t.bytes.size();
          return r;
        };
        q.values = raw(tensors[0]);
        q.scale = raw(tensors[1]);
        if (!symmetric) q.zero_point = raw(tensors.back());
        std::vector<std::byte> buf(static_cast<std::size_t>(out * in) * 2);
        cpu::kernels::dequantize_rows(q, 0, out, buf.data());
        RawTensor d;
        d.data = buf.data();
        d.dtype = DType::kBF16;
        d.shape = Shape{out, in};
        const std::int64_t g = group > 0 ? group : in;
        for (std::int64_t r = 0; r < out; ++r) {
          for (std::int64_t c = 0; c < in; ++c) {
            const float scale = load_as_float(q.scale, r * (in / g) + c / g);
            const float x = w[static_cast<std::size_t>(r * in + c)];
            const float y = load_as_float(d, r * in + c);
            // FP8 keeps 3 mantissa bits: its step is relative to the value.
            const float step = s == io::QuantScheme::kFp8 ? std::max(std::fabs(x) / 8.0f, scale / 512.0f) : scale;
            INFO("row " << r << " col " << c << " w " << x << " dequantised " << y << " scale " << scale);
            // Asymmetric: the rounded zero point can push the group's extreme past the range (clamped).
            const float steps = symmetric ? 0.5f : 1.0f;
            CHECK(std::fabs(x - y) <= steps * step + 0.01f * std::fabs(x) + 1e-9f);
          }
        }
      }
    }
  }
}

TEST_CASE("the quantiser refuses NaN and Inf weights and a scale its dtype cannot hold, naming the place",
          "[io][quant]") {
  // Before, min/max skipped a NaN and the clamps stored it as a finite code (-448 in FP8, qmin in
  // int4), so a checkpoint `--check-weights` refuses came out of `dgemma quantize` looking healthy.
  const std::int64_t out = 4, in = 64;
  std::vector<float> w(static_cast<std::size_t>(out * in), 0.01f);
  for (const float bad : {std::nanf(""), INFINITY, -INFINITY}) {
    w[static_cast<std::size_t>(2 * in + 37)] = bad;
    for (io::QuantScheme s : {io::QuantScheme::kW4A16, io::QuantScheme::kInt8, io::QuantScheme::kFp8}) {
      io::QuantizeSpec spec;
      spec.scheme = s;
      spec.group_size = s == io::QuantScheme::kW4A16 ? 32 : 0;
      CHECK_THROWS_WITH(io::quantize_matrix(w.data(), out, in, spec),
                        Catch::Matchers::Contains("non-finite weight") &&
                            Catch::Matchers::Contains("row 2, column 37"));
    }
  }
  // Finite BF16 weights whose max - min overflows BF16: the asymmetric scale would be Inf and the
  // group would dequantise to NaN. The symmetric scale of the same weights is finite.
  std::fill(w.begin(), w.end(), 0.01f);
  w[static_cast<std::size_t>(1 * in + 40)] = 3.0e38f;
  w[static_cast<std::size_t>(1 * in + 41)] = -3.0e38f;
  io::QuantizeSpec asym;
  asym.scheme = io::QuantScheme::kW4A16;
  asym.group_size = 32;
  asym.symmetric = false;
  CHECK_THROWS_WITH(io::quantize_matrix(w.data(), out, in, asym),
                    Catch::Matchers::Contains("scale of row 1, columns 32-63 overflows BF16"));
  asym.symmetric = true;
  CHECK_NOTHROW(io::quantize_matrix(w.data(), out, in, asym));
}

TEST_CASE("FP8 E4M3 encode and decode agree on every code", "[io][quant]") {
  for (int b = 0; b < 256; ++b) {
    const float v = quant::fp8_e4m3_to_float(static_cast<std::uint8_t>(b));
    if (std::isnan(v)) continue;
    INFO("code " << b << " value " << v);
    // Zero has two codes; everything else round-trips.
    const std::uint8_t back = quant::float_to_fp8_e4m3(v);
    CHECK((back == b || (v == 0.0f && (back & 0x7f) == 0)));
  }
  CHECK(quant::fp8_e4m3_to_float(0x7e) == 448.0f);
  CHECK(quant::float_to_fp8_e4m3(1e6f) == 0x7e);
  CHECK(quant::float_to_fp8_e4m3(-1e6f) == 0xfe);
  CHECK(quant::fp8_e4m3_to_float(0x01) == 1.0f / 512.0f);
  CHECK(quant::float_to_fp8_e4m3(1.0625f) == quant::float_to_fp8_e4m3(1.0f));  // tie to even
  CHECK(quant::float_to_fp8_e4m3(1.1875f) == quant::float_to_fp8_e4m3(1.25f));
}

TEST_CASE("activation codes keep zeros at zero whatever the chunk's largest value", "[io][quant]") {
  // Below about 3.7e-37, 127 / max|a| overflows: an infinite inverse scale made 0 * inf = NaN,
  // which clamps to the code of -127.
  for (float absmax : {1.0f, 1e-30f, 1e-37f, 1e-38f, 1e-45f}) {
    INFO("max |a| " << absmax);
    const float inv = quant::activation_inverse_scale(absmax);
    CHECK(std::isfinite(inv));
    CHECK(quant::activation_code(0.0f, inv) == 128);
  }
  CHECK(quant::activation_code(1.0f, quant::activation_inverse_scale(1.0f)) == 255);
  CHECK(quant::activation_code(-0.5f, quant::activation_inverse_scale(1.0f)) == 128 - 64);  // -63.5 to even
}

TEST_CASE("quantization_config refusals name the key and the scheme", "[io][quant]") {
  const auto error_of = [](const std::string& qc) {
    try {
      io::parse_quantization_config(io::parse_json_text("{\"quantization_config\": " + qc + "}", "t"), "config.json");
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  const auto ct = [](const std::string& weights, const std::string& format = "pack-quantized") {
    return R"({"quant_method": "compressed-tensors", "format": ")" + format +
           R"(", "config_groups": {"group_0": {"targets": ["Linear"], "weights": )" + weights + "}}}";
  };
  CHECK(error_of(ct(R"({"num_bits": 4, "type": "int", "strategy": "group", "group_size": 32})")).empty());
  CHECK_THAT(error_of(ct(R"({"num_bits": 2, "type": "int", "strategy": "channel"})")), Contains("num_bits") && Contains("int2"));
  CHECK_THAT(error_of(ct(R"({"num_bits": 3, "type": "int", "strategy": "channel"})")), Contains("int3"));
  CHECK_THAT(error_of(ct(R"({"num_bits": 8, "type": "float", "strategy": "block", "block_structure": [128, 128]})",
                         "float-quantized")),
             Contains("block-wise"));
  CHECK_THAT(error_of(ct(R"({"num_bits": 4, "type": "float", "strategy": "tensor_group", "group_size": 16})",
                         "nvfp4-pack-quantized")),
             Contains("NVFP4"));
  CHECK_THAT(error_of(ct(R"({"num_bits": 4, "type": "int", "strategy": "group", "group_size": 32, "actorder": "group"})")),
             Contains("actorder") && Contains("activation-order"));
  CHECK_THAT(error_of(ct(R"({"num_bits": 4, "type": "int", "strategy": "group"})")), Contains("group_size"));
  // actorder as compressed-tensors reads it: false is no ordering, true the old spelling of
  // "group"; strings in any case.
  CHECK(error_of(ct(R"({"num_bits": 4, "type": "int", "strategy": "group", "group_size": 32, "actorder": false})")).empty());
  CHECK(error_of(ct(R"({"num_bits": 4, "type": "int", "strategy": "group", "group_size": 32, "actorder": "WEIGHT"})")).empty());
  CHECK_THAT(error_of(ct(R"({"num_bits": 4, "type": "int", "strategy": "group", "group_size": 32, "actorder": true})")),
             Contains("actorder 'group'"));
  CHECK_THAT(error_of(ct(R"({"num_bits": 4, "type": "int", "strategy": "group", "group_size": 32, "actorder": "Dynamic"})")),
             Contains("actorder 'dynamic'"));
  // A group longer than any row would overflow the group counts (to zero groups, accepting a
  // scale tensor of no bytes): refused.
  CHECK_THAT(error_of(ct(R"({"num_bits": 4, "type": "int", "strategy": "group", "group_size": 9223372036854775807})")),
             Contains("group_size") && Contains("larger than any row"));
  CHECK_THAT(error_of(R"({"quant_method": "gptq", "bits": 4, "group_size": 9223372036854775807})"),
             Contains("group_size") && Contains("larger than any row"));
  CHECK_THAT(error_of(ct(R"({"num_bits": 4, "type": "int", "group_size": -5})")), Contains("group_size"));
  CHECK_THAT(error_of(ct(R"({"num_bits": 8, "type": "int", "strategy": "channel", "dynamic": true})")), Contains("dynamic"));
  CHECK_THAT(error_of(R"({"quant_method": "awq", "bits": 4})"), Contains("quant_method") && Contains("awq"));
  CHECK_THAT(error_of(R"({"quant_method": "gptq", "bits": 3, "group_size": 128})"), Contains("bits") && Contains("3 bits"));
  CHECK_THAT(error_of(R"({"quant_method": "gptq", "bits": 4, "checkpoint_format": "marlin"})"), Contains("marlin"));
  CHECK_THAT(error_of(R"({"quant_method": "compressed-tensors", "quantization_status": "frozen", "config_groups": {}})"),
             Contains("quantization_status"));
  CHECK_THAT(error_of(R"({"quant_method": "compressed-tensors", "sparsity_config": {"format": "sparse-24"}, "config_groups": {}})"),
             Contains("sparsity_config"));
  CHECK_THAT(error_of(R"({"quant_method": "compressed-tensors", "config_groups": {}, "ignore": ["re:(unclosed"]})"),
             Contains("ignore") && Contains("re:(unclosed"));
  CHECK_THAT(error_of(R"({"quant_method": "compressed-tensors", "config_groups": {}, "ignore": ["re:a{1000}"]})"),
             Contains("ignore") && Contains("has a {n} repetition"));
  // A backreference, and the digit run libstdc++ would overflow a long on (a fuzzer finding),
  // are refused before the regex library sees them; an escaped backslash before a digit is not one.
  CHECK_THAT(error_of(R"({"quant_method": "compressed-tensors", "config_groups": {}, "ignore": ["re:(a)\\1"]})"),
             Contains("ignore") && Contains("has a backreference"));
  CHECK_THAT(error_of(R"({"quant_method": "compressed-tensors", "config_groups": {}, "ignore": ["re:x\\5555555555555555555"]})"),
             Contains("ignore") && Contains("has a backreference"));
  CHECK(error_of(R"({"quant_method": "compressed-tensors", "config_groups": {}, "ignore": ["re:a\\\\1"]})").empty());
}

TEST_CASE("a missing strategy is inferred from group_size, as compressed-tensors does", "[io][quant]") {
  const auto strategy_of = [](const std::string& weights) {
    const std::string qc = R"({"quant_method": "compressed-tensors", "format": "pack-quantized", "config_groups": )"
                           R"({"group_0": {"targets": ["Linear"], "weights": )" + weights + "}}}";
    const auto c = io::parse_quantization_config(io::parse_json_text("{\"quantization_config\": " + qc + "}", "t"),
                                                 "config.json");
    REQUIRE(c.groups.size() == 1);
    return c.groups[0].weights.strategy + "/" + std::to_string(c.groups[0].weights.group_size);
  };
  CHECK(strategy_of(R"({"num_bits": 4, "type": "int", "group_size": 64})") == "group/64");
  CHECK(strategy_of(R"({"num_bits": 4, "type": "int", "group_size": -1})").rfind("channel/", 0) == 0);
  CHECK(strategy_of(R"({"num_bits": 8, "type": "int"})").rfind("tensor/", 0) == 0);
  CHECK(strategy_of(R"({"num_bits": 8, "type": "int", "group_size": null})").rfind("tensor/", 0) == 0);
}

TEST_CASE("mixed-precision configs take each group's own format", "[io][quant]") {
  const auto parse = [](const std::string& groups) {
    return io::parse_quantization_config(
        io::parse_json_text(R"({"quantization_config": {"quant_method": "compressed-tensors", "format": "mixed-precision",
          "config_groups": )" + groups + "}}",
                            "t"),
        "config.json");
  };
  const io::QuantizationConfig c = parse(R"({
      "attn": {"targets": ["re:.*self_attn.*"], "format": "float-quantized",
               "weights": {"num_bits": 8, "type": "float", "strategy": "channel"}},
      "mlp": {"targets": ["Linear"], "format": "pack-quantized",
              "weights": {"num_bits": 4, "type": "int", "strategy": "group", "group_size": 64, "symmetric": false}}})");
  REQUIRE(c.groups.size() == 2);
  CHECK(c.group_of("model.decoder.layers.0.self_attn.q_proj", "Linear") == 0);
  CHECK(c.group_of("model.decoder.layers.0.mlp.up_proj", "Linear") == 1);
  CHECK(c.groups[0].weights.format == "float-quantized");
  CHECK(c.groups[1].weights.format == "pack-quantized");
  CHECK_THAT(c.describe(), Contains("fp8 e4m3 per channel") && Contains("int4 group 64 asymmetric"));
  try {
    parse(R"({"g": {"targets": ["Linear"], "weights": {"num_bits": 4, "type": "int", "strategy": "channel"}}})");
    FAIL("a mixed-precision group without its own format was accepted");
  } catch (const Error& e) {
    CHECK_THAT(std::string(e.what()), Contains("format") && Contains("mixed-precision"));
  }
}

TEST_CASE("ignore and targets follow compressed-tensors' matching rules", "[io][quant]") {
  const io::QuantizationConfig c = io::parse_quantization_config(
      io::parse_json_text(R"({"quantization_config": {"quant_method": "compressed-tensors", "format": "pack-quantized",
        "config_groups": {"g": {"targets": ["Linear"], "weights": {"num_bits": 4, "type": "int", "strategy": "channel"}}},
        "ignore": ["lm_head", "re:.*router.*", "re:model\\.decoder\\.layers\\.0\\."]}})",
                          "t"),
      "config.json");
  CHECK(c.group_of("model.decoder.layers.1.mlp.gate_proj", "Linear") == 0);
  CHECK(c.group_of("model.decoder.layers.1.router.proj", "Linear") == -1);
  CHECK(c.group_of("model.decoder.layers.0.mlp.gate_proj", "Linear") == -1);  // anchored at the start, not the end
  CHECK(c.group_of("lm_head", "Linear") == -1);
  CHECK(c.group_of("model.decoder.embed_tokens", "Embedding") == -1);  // not a Linear, not targeted
}

TEST_CASE("bad quantized tensors are refused before any compute, naming the tensor", "[io][quant]") {
  const std::string q = "model.decoder.layers.0.self_attn.q_proj";
  {
    EditedFixture f("w4a16_asym_g64", {}, {q + ".weight_scale"});
    CHECK_THAT(load_error(f.dir), Contains("missing tensors") && Contains(q + ".weight_scale"));
  }
  {
    EditedFixture f("w4a16_asym_g64", {}, {q + ".weight_zero_point"});
    CHECK_THAT(load_error(f.dir), Contains(q + ".weight_zero_point"));
  }
  {
    EditedFixture f("w4a16_asym_g64", {{q + ".weight_shape", {64, 65}}}, {});
    CHECK_THAT(load_error(f.dir), Contains(q + ".weight_shape"));
  }
  {
    EditedFixture f("w4a16_asym_g64", {{q + ".weight_scale", {1, 2, 3}}}, {});
    CHECK_THAT(load_error(f.dir), Contains(q + ".weight_scale") && Contains("expected"));
  }
  {
    // The config says group 32, the tensors were written with group 64.
    EditedFixture f("w4a16_asym_g64", {}, {}, "\"group_size\": 64", "\"group_size\": 32");
    CHECK_THAT(load_error(f.dir), Contains(".weight_scale"));
  }
  {
    // Stored quantized, but the config's ignore list says the module stays in BF16.
    EditedFixture f("w4a16_asym_g64", {}, {}, "\"lm_head\",", "\"lm_head\", \"re:.*q_proj\",");
    CHECK_THAT(load_error(f.dir), Contains("q_proj") && Contains("does not quantize module"));
  }
  {
    const std::string g = "model.decoder.layers.0.self_attn.q_proj";
    EditedFixture f("gptq_sym", {{g + ".g_idx", std::vector<std::int32_t>(64, 7)}}, {});
    CHECK_THAT(load_error(f.dir), Contains(g + ".g_idx") && Contains("outside"));
  }
  {
    EditedFixture f("w4a16_asym_g64", {{q + ".weight_g_idx", std::vector<std::int32_t>(64, 0)}}, {});
    CHECK_THAT(load_error(f.dir), Contains(q + ".weight_g_idx") && Contains("activation-order"));
  }
}

namespace {

// gptq_dynamic with its quantization config rewritten (the tensors linked, not copied): in
// config.json's quantization_config, or (in_config_json false) only in quantize_config.json.
std::string gptq_dynamic_with(const std::string& name, const std::string& quantization_config, bool in_config_json) {
  const std::string src = quant_fixture("gptq_dynamic");
  const std::string dir = dg_test::temp_dir(name);
  io::Json config = io::read_json_file(src + "/config.json");
  config.erase("quantization_config");
  std::string text = config.dump();
  if (in_config_json) text = text.substr(0, text.size() - 1) + ", \"quantization_config\": " + quantization_config + "}";
  std::ofstream(dir + "/config.json") << text;
  std::ofstream(dir + "/generation_config.json") << io::read_text_file(src + "/generation_config.json");
  std::remove((dir + "/quantize_config.json").c_str());
  if (!in_config_json) std::ofstream(dir + "/quantize_config.json") << quantization_config;
  std::remove((dir + "/model.safetensors").c_str());
  REQUIRE(::symlink((src + "/model.safetensors").c_str(), (dir + "/model.safetensors").c_str()) == 0);
  return dir;
}

}  // namespace

// GPTQModel's `dynamic` (tools/reference/make_quant_fixtures.py, gptq_dynamic): per-module bits,
// group sizes, act-order and symmetry, and modules left unquantized; the first rule in the file's
// order that matches the module's name from its start decides, as in GPTQModel and vLLM.
TEST_CASE("GPTQ dynamic overrides decide each module, the first matching rule in the file's order",
          "[io][quant]") {
  const io::LoadedCheckpoint c = io::load_checkpoint(quant_fixture("gptq_dynamic"));
  const LayerWeights& L0 = c.weights.layers[0];
  const LayerWeights& L1 = c.weights.layers[1];
  CHECK_THAT(c.quantization.describe(), Contains("4 dynamic overrides"));
  // "-:.*layers\.1\.self_attn\.[qk]_proj$": stored and used in BF16; o_proj is not matched.
  CHECK(L1.q_proj.is_dense());
  CHECK(L1.k_proj.is_dense());
  REQUIRE(L1.o_proj.is_quantized());
  CHECK(L1.o_proj.quant->bits == 4);
  CHECK(L1.o_proj.quant->group_size == 32);
  // "+:.*layers\.0\.mlp\.": 8 bits, groups of 64.
  REQUIRE(L0.mlp_down.is_quantized());
  CHECK(L0.mlp_down.quant->bits == 8);
  CHECK(L0.mlp_down.quant->group_size == 64);
  // Experts 1 and 3 of both layers take the first rule (groups of 16, act-order) though layer 1's
  // also match the last one (asymmetric); layer 1's other experts take the last.
  for (const LayerWeights* L : {&L0, &L1}) {
    const Weight e1 = L->experts_down.group(1);
    REQUIRE(e1.is_quantized());
    CHECK(e1.quant->group_size == 16);
    CHECK_THAT(e1.quant->scheme, Contains("act-order") && Contains(" symmetric"));
  }
  const Weight l1e0 = L1.experts_down.group(0);
  REQUIRE(l1e0.is_quantized());
  CHECK(l1e0.quant->group_size == 32);
  CHECK_THAT(l1e0.quant->scheme, Contains("asymmetric"));
  const io::SafetensorsFile want(quant_fixture("gptq_dynamic") + "/dequantized.safetensors");
  CHECK(dense_values(L0.experts_down.group(1)) == dg_test::floats(want, "model.decoder.layers.0.experts.1.down_proj.weight"));

  // The order is the file's, not the sorted one a parsed JSON object keeps: with the last rule
  // written first, it decides layer 1's expert 1.
  const std::string reordered = gptq_dynamic_with("gptq_dynamic_reordered", R"({
    "bits": 4, "group_size": 32, "desc_act": false, "sym": true, "checkpoint_format": "gptq", "quant_method": "gptq",
    "dynamic": {".*layers\\.1\\.experts\\.": {"sym": false}, "+:.*experts\\.[13]\\.": {"group_size": 16, "desc_act": true}}})",
                                                   /*in_config_json=*/true);
  const io::QuantizationConfig r = io::load_quantization_config(reordered);
  CHECK(r.gptq_scheme_of("model.decoder.layers.1.experts.1.down_proj").rule == ".*layers\\.1\\.experts\\.");
  CHECK(r.gptq_scheme_of("model.decoder.layers.0.experts.1.down_proj").rule == "+:.*experts\\.[13]\\.");
  CHECK(r.gptq_scheme_of("model.decoder.layers.0.mlp.up_proj").rule.empty());
  // ...and then the stored group size of that expert no longer agrees: refused, naming the tensor.
  CHECK_THROWS_WITH(io::load_checkpoint(reordered), Contains("layers.1.experts.1.") && Contains("scales"));

  // A module a "-:" rule excludes but the checkpoint stores packed is refused.
  const std::string excluded = gptq_dynamic_with("gptq_dynamic_excluded", R"({
    "bits": 4, "group_size": 32, "desc_act": false, "sym": true, "quant_method": "gptq",
    "dynamic": {"-:.*layers\\.1\\.self_attn\\.": {}, "+:.*experts\\.[13]\\.": {"group_size": 16, "desc_act": true},
                "+:.*layers\\.0\\.mlp\\.": {"bits": 8, "group_size": 64}, ".*layers\\.1\\.experts\\.": {"sym": false}}})",
                                                  /*in_config_json=*/false);
  CHECK_THROWS_WITH(io::load_checkpoint(excluded),
                    Contains("layers.1.self_attn.o_proj.qweight") && Contains("dynamic excludes"));
}

TEST_CASE("GPTQ dynamic overrides are checked before anything loads", "[io][quant]") {
  const auto error_of = [](const std::string& dynamic) {
    try {
      io::parse_quantization_config(
          io::parse_json_text(R"({"quantization_config": {"quant_method": "gptq", "bits": 4, "dynamic": )" + dynamic + "}}",
                              "t"),
          "config.json");
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  CHECK(error_of(R"({"-:.*router.*": {}, "+:.*mlp.*": {"bits": 8, "damp_percent": 0.1}})").empty());
  CHECK(error_of("null").empty());
  CHECK_THAT(error_of("[]"), Contains("dynamic"));
  CHECK_THAT(error_of(R"({"+:.*mlp.*": 8})"), Contains("dynamic.+:.*mlp.*") && Contains("object of overrides"));
  CHECK_THAT(error_of(R"({"+:.*mlp.*": {"bits": 3}})"), Contains("bits") && Contains("3 bits"));
  CHECK_THAT(error_of(R"({"+:.*mlp.*": {"group_size": 0}})"), Contains("group_size"));
  CHECK_THAT(error_of(R"({"+:.*mlp.*": {"desc_act": "yes"}})"), Contains("desc_act"));
  CHECK_THAT(error_of(R"({"+:.*mlp.*": {"adapter": {"name": "lora", "rank": 8}}})"), Contains("adapter"));
  CHECK_THAT(error_of(R"({"+:(unclosed": {}})"), Contains("(unclosed") && Contains("regular expression"));
  CHECK_THAT(error_of(R"({"+:a{1000}": {}})"), Contains("{n} repetition"));
}
