// SPDX-License-Identifier: Apache-2.0
// dgemma info, tokenize and detokenize.
#include <cstdio>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include <diffusion_gemma/cpu/kv_cache.hpp>
#include <diffusion_gemma/io/config.hpp>
#include <diffusion_gemma/io/safetensors.hpp>
#include <diffusion_gemma/io/tokenizer.hpp>
#include <diffusion_gemma/io/utf8.hpp>

#include "commands.hpp"
#include "common.hpp"

namespace dgemma {

namespace dg = diffusion_gemma;

namespace {

struct ParamCounts {
  double total = 0, active = 0, experts = 0, embeddings = 0;
};

// Parameter counts from the config alone (no weights read): total, and active per token
// (every parameter except the experts a token is not routed to).
ParamCounts count_params(const dg::ModelConfig& c) {
  ParamCounts p;
  const double H = c.hidden_size, I = c.intermediate_size, V = static_cast<double>(c.vocab_size);
  p.embeddings = V * H;
  double rest = H;  // final norm
  for (const auto& s : c.layers) {
    const double D = s.head_dim, q = c.num_heads * D, kv = s.num_kv_heads * D;
    rest += H * q + H * kv * (s.has_v_proj ? 2 : 1) + q * H + 2 * D;  // q, k, (v), o, q/k norms
    rest += 3 * H * I + 1;                                            // dense MLP, layer_scalar
    rest += c.enable_moe_block ? 7 * H : 4 * H;                       // layer norms
    if (c.enable_moe_block) {
      rest += c.num_experts * H + H + c.num_experts;  // router
      p.experts += static_cast<double>(c.num_experts) * 3.0 * H * c.moe_intermediate_size;
    }
  }
  if (c.is_diffusion()) rest += H + 3 * H * I;  // self-conditioning MLP
  p.total = p.embeddings + rest + p.experts;
  p.active = p.total - p.experts * (1.0 - (c.enable_moe_block ? static_cast<double>(c.top_k_experts) / c.num_experts : 0.0));
  return p;
}

std::string human_bytes(double b) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (b >= 1024.0 && u < 4) {
    b /= 1024.0;
    ++u;
  }
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.2f %s", b, units[u]);
  return buf;
}

std::string human_count(double n) {
  char buf[64];
  if (n >= 1e9) {
    std::snprintf(buf, sizeof buf, "%.3f B", n / 1e9);
  } else if (n >= 1e6) {
    std::snprintf(buf, sizeof buf, "%.3f M", n / 1e6);
  } else {
    std::snprintf(buf, sizeof buf, "%.0f", n);
  }
  return buf;
}

}  // namespace

int cmd_info(const std::vector<std::string>& args) {
  Flags f("info", "Summarises a checkpoint: config, parameter counts, memory for weights and KV cache.",
          {{"model", "DIR", "checkpoint directory (default: the bundled model)"}, {"json", "", "print JSON"}});
  if (!f.parse(args)) {
    std::cout << f.usage();
    return 0;
  }
  const std::string dir = f.str("model", DG_DEFAULT_MODEL_DIR);
  if (::access(dir.c_str(), F_OK) != 0) throw dg::Error(dg::StatusCode::kNotFound, dir + ": model directory does not exist");
  const dg::ModelConfig c = dg::io::load_model_config(dir);
  const dg::GenerationConfig g = dg::io::load_generation_config(dir);
  const dg::io::Checkpoint ckpt(dir);
  double stored = 0;
  for (const auto& n : ckpt.names()) stored += static_cast<double>(ckpt.find(n)->tensor.nbytes);
  const ParamCounts p = count_params(c);
  double kv_bf16 = 0;
  int sliding = 0, full = 0;
  for (const auto& s : c.layers) {
    kv_bf16 += 2.0 * 2.0 * s.num_kv_heads * s.head_dim * 1024;
    (s.type == dg::LayerType::kFull ? full : sliding)++;
  }
  const double kv_cpu = static_cast<double>(dg::cpu::KvCache::bytes_for(c, 1024));
  if (f.flag("json")) {
    nlohmann::ordered_json j = {{"model", dir},
                                {"family", c.is_diffusion() ? "diffusion_gemma" : "gemma4_text"},
                                {"layers", c.num_layers()},
                                {"sliding_layers", sliding},
                                {"full_layers", full},
                                {"hidden_size", c.hidden_size},
                                {"vocab_size", c.vocab_size},
                                {"experts", c.num_experts},
                                {"top_k_experts", c.top_k_experts},
                                {"canvas_length", c.canvas_length},
                                {"parameters_total", p.total},
                                {"parameters_active_per_token", p.active},
                                {"checkpoint_bytes", stored},
                                {"cpu_weight_bytes_fp32", p.total * 4},
                                {"kv_cache_bytes_per_1k_tokens_bf16", kv_bf16},
                                {"kv_cache_bytes_per_1k_tokens_cpu_fp32", kv_cpu}};
    std::cout << j.dump(1) << "\n";
    return 0;
  }
  std::printf("model            %s (%s)\n", dir.c_str(), c.is_diffusion() ? "DiffusionGemma" : "Gemma 4 text");
  std::printf("layers           %d (%d sliding, window %d; %d full)\n", c.num_layers(), sliding, c.sliding_window, full);
  std::printf("hidden           %d, %d query heads; head dim %d / %d (sliding / full)\n", c.hidden_size, c.num_heads,
              c.layers.front().head_dim, c.layers.back().head_dim);
  std::printf("feed-forward     dense MLP %d", c.intermediate_size);
  if (c.enable_moe_block) std::printf(" + %d experts x %d, top-%d", c.num_experts, c.moe_intermediate_size, c.top_k_experts);
  std::printf("\nvocabulary       %lld\n", static_cast<long long>(c.vocab_size));
  if (c.is_diffusion()) {
    std::printf("canvas           %d tokens; up to %d steps, entropy bound %g, T %g -> %g\n", c.canvas_length,
                g.max_denoising_steps, g.entropy_bound, g.t_max, g.t_min);
  }
  std::printf("parameters       %s total, %s active per token\n", human_count(p.total).c_str(), human_count(p.active).c_str());
  std::printf("weights          %s in the checkpoint (%zu file%s); %s as fp32 on the CPU back-end\n",
              human_bytes(stored).c_str(), ckpt.num_shards(), ckpt.num_shards() == 1 ? "" : "s",
              human_bytes(p.total * 4).c_str());
  std::printf("KV cache         %s per 1k tokens in bf16; %s in the CPU back-end's fp32\n", human_bytes(kv_bf16).c_str(),
              human_bytes(kv_cpu).c_str());
  return 0;
}

int cmd_tokenize(const std::vector<std::string>& args, bool detokenize) {
  std::vector<FlagSpec> specs = {{"tokenizer", "FILE", "a tokenizer.json"},
                                 {"model", "DIR", "a checkpoint directory holding tokenizer.json"}};
  if (detokenize) {
    specs.push_back({"ids", "IDS", "comma-separated token ids"});
    specs.push_back({"no-special", "", "drop special tokens from the text (default: keep them)"});
  } else {
    specs.push_back({"text", "TEXT", "the text"});
    specs.push_back({"text-file", "FILE", "read the text from a file"});
    specs.push_back({"no-special", "", "do not add special tokens (no <bos>)"});
  }
  Flags f(detokenize ? "detokenize" : "tokenize",
          detokenize ? "Prints the text of token ids." : "Prints the ids of a text as a JSON array.", specs);
  if (!f.parse(args)) {
    std::cout << f.usage();
    return 0;
  }
  if (f.has("tokenizer") == f.has("model")) throw UsageError("give exactly one of --tokenizer, --model");
  const std::string path = f.has("tokenizer") ? f.str("tokenizer") : f.str("model") + "/tokenizer.json";
  const auto tok = dg::io::Tokenizer::from_file(path);
  if (detokenize) {
    std::vector<int> ids;
    for (auto id : f.integers("ids", 0, INT32_MAX)) ids.push_back(static_cast<int>(id));
    std::cout << tok.decode(ids, f.flag("no-special")) << "\n";
    return 0;
  }
  if (f.has("text") == f.has("text-file")) throw UsageError("give exactly one of --text, --text-file");
  const std::string text = f.has("text") ? f.str("text") : dg::io::read_text_file(f.str("text-file"));
  std::cout << nlohmann::json(tok.encode(text, !f.flag("no-special"))).dump() << "\n";
  return 0;
}

}  // namespace dgemma
