// SPDX-License-Identifier: Apache-2.0
// Writes a random-weight checkpoint of a config (the released 26B-A4B shape:
// tools/reference/make_bench_checkpoints.py --config-only real) directly in W4A16, group 64,
// symmetric, compressed-tensors layout with experts split per expert, the way `dgemma quantize`
// would write it, without a BF16 copy ever existing on disk or in memory. Streams tensor by tensor.
//
//   make_real_w4a16 --config DIR_WITH_CONFIG_JSON --out DIR [--seed N] [--shard-gib G]
//
// Scales are chosen so that weights have the spread of a trained model: matrices std
// 1/sqrt(fan_in) (4-bit codes are uniform, so each group's scale is that std / 4.61), norm weights
// around 1, embedding std 0.03, router projection std 1/sqrt(hidden) so that routing logits have
// unit spread and tokens spread over the experts.
#include <sys/stat.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include <diffusion_gemma/core/bfloat16.hpp>
#include <diffusion_gemma/io/config.hpp>
#include <diffusion_gemma/io/json_file.hpp>
#include <diffusion_gemma/io/quantize.hpp>
#include <diffusion_gemma/io/safetensors_writer.hpp>
#include <diffusion_gemma/model/weights.hpp>

namespace dg = diffusion_gemma;

namespace {

std::string arg(int argc, char** argv, const char* name, const std::string& fallback) {
  for (int i = 1; i + 1 < argc; ++i)
    if (std::strcmp(argv[i], name) == 0) return argv[i + 1];
  return fallback;
}

// splitmix64: fast, and every tensor gets its own stream from (seed, tensor index).
struct Rng {
  std::uint64_t s;
  std::uint64_t next() {
    std::uint64_t z = (s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  // Approximately normal: the sum of four uniforms, scaled to unit variance.
  float normal() {
    const std::uint64_t r = next();
    float sum = 0.0f;
    for (int i = 0; i < 4; ++i) sum += static_cast<float>((r >> (16 * i)) & 0xffff) * (1.0f / 65536.0f);
    return (sum - 2.0f) * 1.7320508f;
  }
};

struct Item {
  std::string name;  // module (quantised) or tensor (plain)
  bool quantized = false;
  dg::Shape shape;
  float std = 0.0f, mean = 0.0f;  // plain: value distribution
  std::vector<dg::io::TensorSpec> outputs;
  std::uint64_t bytes() const {
    std::uint64_t n = 0;
    for (const auto& t : outputs) n += t.nbytes();
    return n;
  }
};

}  // namespace

int main(int argc, char** argv) {
  const std::string config_dir = arg(argc, argv, "--config", ""), out = arg(argc, argv, "--out", "");
  if (config_dir.empty() || out.empty()) {
    std::fprintf(stderr, "usage: make_real_w4a16 --config DIR --out DIR [--seed N] [--shard-gib G]\n");
    return 2;
  }
  const std::uint64_t seed = std::strtoull(arg(argc, argv, "--seed", "1").c_str(), nullptr, 10);
  const auto shard_limit = static_cast<std::uint64_t>(std::atof(arg(argc, argv, "--shard-gib", "4").c_str()) * (1ull << 30));
  try {
    const dg::ModelConfig cfg = dg::io::load_model_config(config_dir);
    dg::io::QuantizeSpec spec;
    spec.scheme = dg::io::QuantScheme::kW4A16;
    spec.group_size = 64;
    const std::string pre = "model.decoder.";
    std::vector<Item> items;
    const auto plain = [&](const std::string& name, dg::Shape shape, float mean, float std) {
      Item it;
      it.name = name;
      it.shape = shape;
      it.mean = mean;
      it.std = std;
      it.outputs.push_back({name, dg::DType::kBF16, shape});
      items.push_back(std::move(it));
    };
    const auto quantized = [&](const std::string& module, std::int64_t rows, std::int64_t cols) {
      Item it;
      it.name = module;
      it.quantized = true;
      it.shape = dg::Shape{rows, cols};
      it.std = 1.0f / std::sqrt(static_cast<float>(cols));
      for (auto& t : dg::io::planned_tensors(rows, cols, spec)) it.outputs.push_back({module + t.suffix, t.dtype, t.shape});
      items.push_back(std::move(it));
    };
    dg::ModelWeights shapes;
    shapes.layers.resize(cfg.layers.size());
    dg::for_each_parameter(cfg, shapes, [&](const dg::ParamSpec& p, dg::Weight&) {
      const std::string name = pre + p.name;
      const std::int64_t H = cfg.hidden_size;
      switch (p.param) {
        case dg::Param::kEmbedTokens: return plain(name, p.shape, 0.0f, 0.03f);
        case dg::Param::kLayerScalar: return plain(name, p.shape, 0.8f, 0.1f);
        case dg::Param::kRouterProj: return plain(name, p.shape, 0.0f, 1.0f / std::sqrt(static_cast<float>(H)));
        case dg::Param::kScGate:
        case dg::Param::kScUp:
        case dg::Param::kScDown:
          return plain(name, p.shape, 0.0f, 1.0f / std::sqrt(static_cast<float>(p.shape[1])));
        case dg::Param::kExpertsGateUp:
        case dg::Param::kExpertsDown: {
          const std::string e0 = pre + "layers." + std::to_string(p.layer) + ".experts.";
          for (std::int64_t e = 0; e < cfg.num_experts; ++e) {
            const std::string m = e0 + std::to_string(e) + ".";
            if (p.param == dg::Param::kExpertsGateUp) {
              quantized(m + "gate_proj", cfg.moe_intermediate_size, H);
              quantized(m + "up_proj", cfg.moe_intermediate_size, H);
            } else {
              quantized(m + "down_proj", H, cfg.moe_intermediate_size);
            }
          }
          return;
        }
        default: break;
      }
      if (p.is_matrix()) return quantized(name.substr(0, name.size() - 7), p.shape[0], p.shape[1]);
      plain(name, p.shape, 1.0f, 0.1f);  // norms, router scales
    });
    for (int l = 0; l < cfg.num_layers(); ++l) {
      plain("model.encoder.language_model.layers." + std::to_string(l) + ".layer_scalar", dg::Shape{1}, 0.8f, 0.1f);
    }
    // Layer scalars must agree between encoder and decoder copies: both come from the same stream.
    std::vector<std::vector<std::size_t>> shards(1);
    std::uint64_t in_shard = 0, total = 0;
    for (std::size_t i = 0; i < items.size(); ++i) {
      if (in_shard > 0 && in_shard + items[i].bytes() > shard_limit) {
        shards.emplace_back();
        in_shard = 0;
      }
      shards.back().push_back(i);
      in_shard += items[i].bytes();
      total += items[i].bytes();
    }
    ::mkdir(out.c_str(), 0755);
    std::fprintf(stderr, "make_real_w4a16: %zu tensors groups, %.2f GiB in %zu shards\n", items.size(), total / 1073741824.0,
                 shards.size());
    const auto start = std::chrono::steady_clock::now();
    nlohmann::ordered_json weight_map = nlohmann::ordered_json::object();
    std::uint64_t done = 0, last = 0;
    std::vector<unsigned char> buf;
    char file[64];
    for (std::size_t s = 0; s < shards.size(); ++s) {
      std::snprintf(file, sizeof file, "model-%05zu-of-%05zu.safetensors", s + 1, shards.size());
      std::vector<dg::io::TensorSpec> specs;
      for (std::size_t i : shards[s])
        for (const auto& t : items[i].outputs) {
          specs.push_back(t);
          weight_map[t.name] = file;
        }
      dg::io::SafetensorsStream stream(out + "/" + file, specs);
      for (std::size_t i : shards[s]) {
        const Item& it = items[i];
        // Layer scalars: one stream per layer index, so the encoder's copy equals the decoder's.
        std::uint64_t key = i;
        const auto at = it.name.find("layers.");
        if (it.name.find("layer_scalar") != std::string::npos && at != std::string::npos) {
          key = 1000000 + std::stoull(it.name.substr(at + 7));
        }
        Rng rng{seed * 0x100000001B3ull + key};
        if (!it.quantized) {
          const std::int64_t n = it.shape.numel();
          constexpr std::int64_t kPiece = 1 << 22;
          buf.resize(static_cast<std::size_t>(std::min(n, kPiece)) * 2);
          for (std::int64_t off = 0; off < n; off += kPiece) {
            const std::int64_t m = std::min(kPiece, n - off);
            for (std::int64_t k = 0; k < m; ++k) {
              const std::uint16_t b = dg::bfloat16::from_float(it.mean + it.std * rng.normal()).bits;
              std::memcpy(buf.data() + 2 * k, &b, 2);
            }
            stream.append(buf.data(), static_cast<std::uint64_t>(m) * 2);
          }
        } else {
          // Uniform 4-bit codes (std 4.61) and per-group scales near std / 4.61.
          const std::int64_t rows = it.shape[0], cols = it.shape[1], groups = cols / 64;
          buf.resize(static_cast<std::size_t>(rows * cols / 2));
          for (std::size_t k = 0; k < buf.size(); k += 8) {
            const std::uint64_t r = rng.next();
            std::memcpy(buf.data() + k, &r, std::min<std::size_t>(8, buf.size() - k));
          }
          stream.append(buf.data(), buf.size());
          std::vector<std::uint16_t> scales(static_cast<std::size_t>(rows * groups));
          for (auto& sc : scales) sc = dg::bfloat16::from_float(it.std / 4.61f * (0.8f + 0.4f * (rng.next() >> 40) / 16777216.0f)).bits;
          stream.append(scales.data(), scales.size() * 2);
          const std::int64_t dims[2] = {rows, cols};
          stream.append(dims, 16);
        }
        done += it.bytes();
        if (done - last > total / 50 || done == total) {
          last = done;
          std::fprintf(stderr, "make_real_w4a16: %3.0f%% %.2f GiB %.0f s\n", 100.0 * done / total, done / 1073741824.0,
                       std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
        }
      }
      stream.finish();
    }
    nlohmann::ordered_json index;
    index["metadata"] = {{"total_size", total}};
    index["weight_map"] = weight_map;
    std::ofstream(out + "/model.safetensors.index.json") << index.dump(1) << "\n";
    nlohmann::ordered_json config = nlohmann::ordered_json::parse(dg::io::read_text_file(config_dir + "/config.json"));
    config["quantization_config"] = spec.config_json(dg::io::default_ignore());
    std::ofstream(out + "/config.json") << config.dump(2) << "\n";
    if (FILE* g = std::fopen((config_dir + "/generation_config.json").c_str(), "rb")) {
      std::fclose(g);
      std::ofstream(out + "/generation_config.json") << dg::io::read_text_file(config_dir + "/generation_config.json");
    } else {
      // The released model's sampler defaults, stated explicitly.
      std::ofstream(out + "/generation_config.json")
          << R"({"max_new_tokens": 256, "max_denoising_steps": 48, "t_min": 0.4, "t_max": 0.8, "stability_threshold": 1,)"
          << R"( "confidence_threshold": 0.005, "sampler_config": {"_cls_name": "EntropyBoundSamplerConfig", "entropy_bound": 0.1}, "eos_token_id": [1, 106]})" << "\n";
    }
    std::fprintf(stderr, "make_real_w4a16: wrote %s in %.0f s\n", out.c_str(),
                 std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "make_real_w4a16: %s\n", e.what());
    return 1;
  }
  return 0;
}
