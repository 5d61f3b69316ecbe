// SPDX-License-Identifier: Apache-2.0
// dgemma info, tokenize and detokenize.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include <sys/stat.h>

#include <nlohmann/json.hpp>

#include <diffusion_gemma/cpu/engine.hpp>
#include <diffusion_gemma/cpu/isa.hpp>
#include <diffusion_gemma/cpu/kv_cache.hpp>
#include <diffusion_gemma/io/binder.hpp>
#include <diffusion_gemma/io/config.hpp>
#include <diffusion_gemma/io/quantization_config.hpp>
#include <diffusion_gemma/io/weights.hpp>
#include <diffusion_gemma/io/safetensors.hpp>
#include <diffusion_gemma/io/tokenizer.hpp>
#include <diffusion_gemma/model/weights.hpp>
#include <diffusion_gemma/io/utf8.hpp>

#include "commands.hpp"
#include "common.hpp"

namespace dgemma {

namespace dg = diffusion_gemma;

namespace {

struct ParamCounts {
  double total = 0, active = 0, experts = 0;
};

// Parameter counts from the config alone (no weights read), over model/weights.hpp's one list of
// tensors: total, and active per token (all but the experts a token is not routed to).
ParamCounts count_params(const dg::ModelConfig& c) {
  ParamCounts p;
  dg::ModelWeights shapes;
  shapes.layers.resize(c.layers.size());
  dg::for_each_parameter(c, shapes, [&](const dg::ParamSpec& s, dg::Weight&) {
    const double n = static_cast<double>(s.shape.numel());
    p.total += n;
    if (s.param == dg::Param::kExpertsGateUp || s.param == dg::Param::kExpertsDown) p.experts += n;
  });
  const double routed = c.enable_moe_block ? static_cast<double>(c.top_k_experts) / c.num_experts : 0.0;
  p.active = p.total - p.experts * (1.0 - routed);
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
  Flags f("info",
          "Summarises a checkpoint: config, parameter counts, the CPU kernels this machine runs, and the\n"
          "memory a generation needs. config.json alone is enough (weight files are optional). Exits 1\n"
          "when weight files are present but do not match config.json (the summary is printed first).",
          {{"model", "DIR", "checkpoint directory (default: the bundled model)"},
           {"prompt-tokens", "N", "prompt length for the memory estimate (default 1024, or the longest that fits)"},
           {"max-new-tokens", "N", "new tokens for the memory estimate (default: generation_config.json, fitted)"},
           {"threads", "N", "CPU threads for the workspace estimate (default: all)"},
           {"json", "", "print JSON"}});
  if (!f.parse(args)) {
    std::cout << f.usage();
    return 0;
  }
  const std::string dir = f.str("model", DG_DEFAULT_MODEL_DIR);
  if (::access(dir.c_str(), F_OK) != 0) throw dg::Error(dg::StatusCode::kNotFound, dir + ": model directory does not exist");
  const dg::ModelConfig c = dg::io::load_model_config(dir);
  dg::GenerationConfig g = dg::io::load_generation_config(dir);
  g.restrict_to_vocabulary(c.vocab_size);  // as a load does: PAD checked, stop ids outside it dropped
  const ParamCounts p = count_params(c);

  // Weights: the files when present (the CPU back-end uses them in place), else the config's dtype.
  double stored = 0, unloaded = 0;
  std::size_t files = 0;
  // lstat: a link whose target is gone (a Hugging Face cache without its blob) is a checkpoint that
  // cannot be read, which the load below says, not a config-only directory.
  const auto present = [&dir](const char* name) {
    struct stat st {};
    return ::lstat((dir + "/" + name).c_str(), &st) == 0;
  };
  const bool has_weights = present("model.safetensors") || present("model.safetensors.index.json");
  const dg::io::QuantizationConfig quant = dg::io::load_quantization_config(dir);
  dg::io::BindReport bound;
  std::string bind_error;
  if (has_weights) {
    const dg::io::Checkpoint ckpt(dir);
    for (const auto& n : ckpt.names()) {
      // Vision and audio towers stay in the files but are never loaded (a text-only backbone).
      (dg::io::detail::is_vision_tensor(n) ? unloaded : stored) += static_cast<double>(ckpt.find(n)->tensor.nbytes);
    }
    files = ckpt.num_shards();
    try {
      dg::io::bind_weights(ckpt, c, quant, &bound);
    } catch (const dg::Error& e) {
      bind_error = e.what();
    }
  }
  const dg::DType config_dtype = c.dtype == dg::DType::kSentinel ? dg::DType::kBF16 : c.dtype;
  const double weight_bytes = has_weights ? stored : p.total * static_cast<double>(dg::dtype_size(config_dtype));

  // A generation: prompt + whole canvases, the KV cache for all of it, the engine's workspace. The
  // defaults fit max_position_embeddings (a 1024-token prompt where it leaves room for the new
  // tokens, else the longest that does); values given that do not fit are refused, since no
  // generation could need that memory.
  using CpuEngine = dg::cpu::Engine<dg::DiffusionGemmaBackbone>;
  // What the engine a generation would compose refuses, refused before estimating anything.
  dg::dispatch_backbone(c, [&](auto backbone) {
    dg::throw_if_error(dg::cpu::Engine<decltype(backbone)>::can_run(c));
  });
  const std::int64_t C = c.is_diffusion() ? c.canvas_length : 1;
  // Token counts are 32-bit in a generation; larger values would also overflow the byte counts.
  const std::int64_t max_pos = std::min<std::int64_t>(c.max_position_embeddings, INT32_MAX);
  const auto whole_canvases = [C](std::int64_t tokens) { return (tokens + C - 1) / C * C; };
  const std::int64_t new_fit = std::max<std::int64_t>(C, (max_pos - 1) / C * C);  // leaves one prompt token
  // generation_config.json's max_length, as a generation applies it: it replaces a max_new_tokens
  // left at its default (and then the default prompt is kept short enough to leave it a token).
  const bool length_bounded = c.is_diffusion() && g.max_length > 0 && !f.has("max-new-tokens") &&
                              g.max_new_tokens == GenerationConfig::kDefaultMaxNewTokens;
  std::int64_t new_tokens = f.integer("max-new-tokens", std::min<std::int64_t>(g.max_new_tokens, new_fit), 1, max_pos);
  std::int64_t prompt_default = std::max<std::int64_t>(1, std::min<std::int64_t>(1024, max_pos - whole_canvases(new_tokens)));
  if (length_bounded) prompt_default = std::max<std::int64_t>(1, std::min<std::int64_t>(prompt_default, g.max_length - 1));
  const std::int64_t prompt = f.integer("prompt-tokens", prompt_default, 1, max_pos);
  if (length_bounded) new_tokens = std::max<std::int64_t>(1, g.max_length - prompt);
  if (prompt + whole_canvases(new_tokens) > max_pos) {
    throw dg::Error(dg::StatusCode::kInvalidArgument,
                    "a " + std::to_string(prompt) + "-token prompt + " + std::to_string(new_tokens) +
                        " new tokens (" + std::to_string(whole_canvases(new_tokens)) +
                        " positions in whole canvases) exceed max_position_embeddings " + std::to_string(max_pos) +
                        "; lower --prompt-tokens or --max-new-tokens");
  }
  // The cache holds the prompt and every canvas but the last, which is never encoded (the
  // scheduler's plan, as a generation and --memory-budget count it).
  std::int64_t capacity = prompt + whole_canvases(new_tokens);
  if (c.is_diffusion()) {
    using Scheduler = dg::Decoder<CpuEngine>::Scheduler;
    typename Scheduler::Arguments a;
    dg::apply_generation_config_to_scheduler<Scheduler>(g, a);
    a.max_new_tokens = static_cast<int>(new_tokens);
    a.max_length = 0;  // applied above
    capacity = Scheduler::plan(a, c, prompt).cache_capacity;
  }
  const int threads = static_cast<int>(f.integer("threads", 0, 0, 1024));
  const double kv = static_cast<double>(dg::cpu::KvCache::bytes_for(c, capacity));
  const double request = static_cast<double>(
      CpuEngine::request_bytes(c, capacity, std::max<std::int64_t>(256, C), threads));
  const double workspace = request - kv;
  const double total = weight_bytes + request;

  double kv_bf16 = 0;
  int sliding = 0, full = 0;
  for (const auto& s : c.layers) {
    kv_bf16 += 2.0 * 2.0 * s.num_kv_heads * s.head_dim * 1024;
    (s.type == dg::LayerType::kFull ? full : sliding)++;
  }
  const double kv_cpu = static_cast<double>(dg::cpu::KvCache::bytes_for(c, 1024));
  const auto& cpu = dg::cpu::cpu_features();
  const dg::cpu::Isa isa = dg::cpu::default_isa();
  dg::cpu::KernelContext kc;
  kc.isa = isa;
  kc.precision = dg::cpu::EngineOptions{}.precision;
  // DG_CPU_INT8_TILES=1 is a request, not a guarantee: say when this machine or path cannot honour it.
  const bool int8_tiles_ignored = kc.amx_int8 && !kc.int8_tiles();
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
                                {"stop_token_ids", g.stop_token_ids},
                                {"ignored_stop_token_ids", g.ignored_stop_token_ids},
                                {"pad_token_id", g.pad_token_id == dg::kNoPadToken ? nlohmann::ordered_json(nullptr)
                                                                                 : nlohmann::ordered_json(g.pad_token_id)},
                                {"max_length", g.max_length > 0 ? nlohmann::ordered_json(g.max_length)
                                                                : nlohmann::ordered_json(nullptr)},
                                {"parameters_total", p.total},
                                {"parameters_active_per_token", p.active},
                                {"weights_present", has_weights},
                                {"checkpoint_bytes", stored},
                                {"unloaded_tower_bytes", unloaded},
                                {"weight_bytes", weight_bytes},
                                {"quantization", quant.describe()},
                                {"quantized_matrices", bound.quantized},
                                {"split_experts", bound.split_experts},
                                {"bind_error", bind_error},
                                {"cpu", cpu.brand},
                                {"cpu_flags", cpu.flags()},
                                {"cpu_isa", dg::cpu::isa_name(isa)},
                                {"cpu_kernels", kc.path()},
                                {"cpu_int8_tiles_ignored", int8_tiles_ignored},
                                {"generation_prompt_tokens", prompt},
                                {"generation_new_tokens", new_tokens},
                                {"generation_cache_positions", capacity},
                                {"generation_kv_cache_bytes", kv},
                                {"generation_workspace_bytes", workspace},
                                {"generation_memory_bytes", total},
                                {"kv_cache_bytes_per_1k_tokens_bf16", kv_bf16},
                                {"kv_cache_bytes_per_1k_tokens_cpu_fp32", kv_cpu}};
    std::cout << j.dump(1) << "\n";
    return bind_error.empty() ? 0 : 1;
  }
  std::printf("model            %s (%s)\n", dir.c_str(), c.is_diffusion() ? "DiffusionGemma" : "Gemma 4 text");
  std::printf("layers           %d (%d sliding, window %d; %d full)\n", c.num_layers(), sliding, c.sliding_window, full);
  const auto head_dim_of = [&](dg::LayerType type) {
    for (const auto& s : c.layers) {
      if (s.type == type) return std::to_string(s.head_dim);
    }
    return std::string("-");  // no layer of that type
  };
  std::printf("hidden           %d, %d query heads; head dim %s / %s (sliding / full)\n", c.hidden_size, c.num_heads,
              head_dim_of(dg::LayerType::kSliding).c_str(), head_dim_of(dg::LayerType::kFull).c_str());
  std::printf("feed-forward     dense MLP %d", c.intermediate_size);
  if (c.enable_moe_block) std::printf(" + %d experts x %d, top-%d", c.num_experts, c.moe_intermediate_size, c.top_k_experts);
  std::printf("\nvocabulary       %lld\n", static_cast<long long>(c.vocab_size));
  if (c.is_diffusion()) {
    std::printf("canvas           %d tokens; up to %d steps, entropy bound %g, T %g -> %g\n", c.canvas_length,
                g.max_denoising_steps, g.entropy_bound, g.t_max, g.t_min);
  }
  const auto id_list = [](const std::vector<int>& ids) {
    std::string s;
    for (const int id : ids) s += (s.empty() ? "" : ", ") + std::to_string(id);
    return s.empty() ? std::string("none") : s;
  };
  std::printf("stop ids         %s", id_list(g.stop_token_ids).c_str());
  if (!g.ignored_stop_token_ids.empty()) {
    std::printf(" (%s ignored: outside the vocabulary)", id_list(g.ignored_stop_token_ids).c_str());
  }
  if (g.pad_token_id == dg::kNoPadToken) {
    std::printf("; no PAD (tokens after a stop id are kept)");
  } else {
    std::printf("; PAD %d", g.pad_token_id);
  }
  if (g.max_length > 0) std::printf("; max_length %d", g.max_length);
  std::printf("\n");
  std::printf("parameters       %s total, %s active per token\n", human_count(p.total).c_str(), human_count(p.active).c_str());
  if (has_weights) {
    std::printf("weights          %s in %zu file%s, used in place (memory-mapped, not copied)\n",
                human_bytes(stored).c_str(), files, files == 1 ? "" : "s");
    if (unloaded > 0) {
      std::printf("                 (and %s of vision/audio tower tensors, not loaded)\n", human_bytes(unloaded).c_str());
    }
  } else {
    std::printf("weights          no weight files: %s as %s (%s by config.json)\n", human_bytes(weight_bytes).c_str(),
                dg::dtype_name(config_dtype), c.dtype == dg::DType::kSentinel ? "not stated, assumed" : "stated");
  }
  std::printf("quantization     %s\n", quant.describe().c_str());
  for (const auto& [scheme, n] : bound.quantized) std::printf("                 %zu matrices %s\n", n, scheme.c_str());
  if (bound.split_experts) std::printf("experts          stored one matrix per expert\n");
  if (!bind_error.empty()) std::printf("weights error    %s\n", bind_error.c_str());
  std::printf("KV cache         %s per 1k tokens in the CPU back-end (fp32); %s in bf16\n", human_bytes(kv_cpu).c_str(),
              human_bytes(kv_bf16).c_str());
  std::printf("generation       %lld-token prompt + %lld new tokens: %s = weights %s + KV cache %s + workspace %s\n",
              static_cast<long long>(prompt), static_cast<long long>(new_tokens), human_bytes(total).c_str(),
              human_bytes(weight_bytes).c_str(), human_bytes(kv).c_str(), human_bytes(workspace).c_str());
  std::printf("cpu              %s\n", cpu.brand.empty() ? "(unknown)" : cpu.brand.c_str());
  std::printf("cpu flags        %s\n", cpu.flags().c_str());
  const char* forced = std::getenv("DG_CPU_ISA");  // empty counts as unset, as cpu/isa.hpp reads it
  std::printf("cpu kernels      %s%s\n", kc.path().c_str(), forced != nullptr && *forced != '\0' ? " (DG_CPU_ISA)" : "");
  if (int8_tiles_ignored) {
    std::printf("                 DG_CPU_INT8_TILES=1 has no effect here: AMX-INT8 tiles need the amx path in fast "
                "precision and a CPU with AMX-INT8 and AVX512-VNNI\n");
  }
  // The summary is still useful for a checkpoint that does not load, but a script must see that.
  if (!bind_error.empty()) {
    std::fprintf(stderr, "dgemma info: error: the weights do not match config.json (see 'weights error' above)\n");
    return 1;
  }
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
    specs.push_back({"text-file", "FILE", "read the text from a file (- for standard input)"});
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
  // Invalid UTF-8 is refused as `dgemma generate` refuses it: a flag's value is a usage error
  // (exit 2), a file's contents are not (exit 1).
  const std::string text = f.has("text") ? f.str("text") : read_utf8_input(f.str("text-file"));
  const auto bad = dg::io::find_invalid_utf8(text);
  if (bad != std::string::npos) throw UsageError("--text is not valid UTF-8 (byte " + std::to_string(bad) + ")");
  std::cout << nlohmann::json(tok.encode(text, !f.flag("no-special"))).dump() << "\n";
  return 0;
}

}  // namespace dgemma
