// SPDX-License-Identifier: Apache-2.0
// dgemma parity and dgemma replay: the contracts the reference tests use.
#include <cstdio>
#include <iostream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include <diffusion_gemma/cpu/engine.hpp>
#include <diffusion_gemma/io/draws.hpp>
#include <diffusion_gemma/io/safetensors.hpp>
#include <diffusion_gemma/io/safetensors_writer.hpp>
#include <diffusion_gemma/runtime/decoder.hpp>

#include "commands.hpp"
#include "common.hpp"
#include "sc_logits.hpp"

namespace dgemma {

namespace dg = diffusion_gemma;

namespace {

std::vector<std::int32_t> as_ids(const std::vector<std::int64_t>& v) { return {v.begin(), v.end()}; }

}  // namespace

int cmd_parity(const std::vector<std::string>& args) {
  Flags f("parity",
          "Runs the encoder over the prompt (positions 0..P-1), then the denoiser over the canvas\n"
          "(positions P..P+C-1), and writes F32 encoder_logits [P, V] and denoise_logits [C, V]\n"
          "(after the final softcap, before any temperature) to a safetensors file.",
          {{"model", "DIR", "checkpoint directory (config.json, model.safetensors[.index.json])"},
           {"prompt-ids", "IDS", "comma-separated prompt token ids"},
           {"canvas-ids", "IDS", "comma-separated canvas token ids (DiffusionGemma only)"},
           {"sc-logits", "FILE", "safetensors with F32 sc_logits [C, V]: previous step's temperature-scaled logits"},
           {"out", "FILE", "output safetensors file"},
           {"check-weights", "", "scan every weight for NaN/Inf at load"},
           {"threads", "N", "CPU threads (default: all)"},
           {"precision", "P", "exact (default: the parity contract) or fast"}});
  if (!f.parse(args)) {
    std::cout << f.usage();
    return 0;
  }
  const std::string out_path = f.required("out");
  refuse_overwriting_checkpoint("out", out_path, f.required("model"));
  require_writable(out_path);  // before the load and both passes
  auto model = load_model(f.required("model"), f.flag("check-weights"));
  const auto& cfg = model->config();
  const auto prompt = as_ids(f.integers("prompt-ids", 0, cfg.vocab_size - 1));
  const bool has_canvas = f.has("canvas-ids");
  if (f.has("sc-logits") && !has_canvas) throw UsageError("--sc-logits needs --canvas-ids");
  if (has_canvas && !cfg.is_diffusion()) throw UsageError("--canvas-ids needs a DiffusionGemma checkpoint");
  const auto canvas = has_canvas ? as_ids(f.integers("canvas-ids", 0, cfg.vocab_size - 1)) : std::vector<std::int32_t>{};
  const dg::cpu::EngineOptions eo = engine_options(f, dg::cpu::Precision::kExact);
  const std::int64_t P = static_cast<std::int64_t>(prompt.size()), C = static_cast<std::int64_t>(canvas.size());
  const std::int64_t V = cfg.vocab_size, H = cfg.hidden_size;
  if (P + C > cfg.max_position_embeddings) {
    throw dg::Error(dg::StatusCode::kOutOfRange, "prompt (" + std::to_string(P) + ") + canvas (" + std::to_string(C) +
                                                     ") exceed max_position_embeddings " +
                                                     std::to_string(cfg.max_position_embeddings));
  }
  dg::io::SafetensorsWriter w;
  dg::dispatch_backbone(cfg, [&](auto backbone) {
    using Backbone = decltype(backbone);
    dg::cpu::Engine<Backbone> engine(model, eo);
    auto cache = engine.make_cache(P);
    std::vector<float> hidden(static_cast<std::size_t>(std::max(P, C) * H)), logits(static_cast<std::size_t>(P * V));
    engine.encode(prompt.data(), P, cache, hidden.data());
    engine.lm_head(hidden.data(), P, logits.data());
    w.add("encoder_logits", dg::Shape{P, V}, logits.data());
    if (C > 0) {
      std::vector<float> soft;
      if (f.has("sc-logits")) {
        const auto sc = read_sc_logits(f.str("sc-logits"), C, V);
        soft.resize(static_cast<std::size_t>(C * H));
        engine.soft_embedding_from_logits(sc.data(), C, soft.data());
      }
      logits.resize(static_cast<std::size_t>(C * V));
      engine.denoise(canvas.data(), C, soft.empty() ? nullptr : soft.data(), cache, hidden.data());
      engine.lm_head(hidden.data(), C, logits.data());
      w.add("denoise_logits", dg::Shape{C, V}, logits.data());
    }
    return 0;
  });
  w.write(out_path);
  std::fprintf(stderr, "wrote %s (P=%lld, C=%lld, V=%lld)\n", out_path.c_str(), static_cast<long long>(P),
               static_cast<long long>(C), static_cast<long long>(V));
  return 0;
}

int cmd_replay(const std::vector<std::string>& args) {
  auto specs = sampler_flag_specs();
  specs.insert(specs.begin(), {{"model", "DIR", "DiffusionGemma checkpoint directory"},
                               {"draws", "FILE", "draws file recorded from transformers (tools/reference)"}});
  for (auto& spec : engine_flag_specs("exact (replay parity holds in exact)")) specs.push_back(spec);
  Flags f("replay",
          "Generates with the random draws recorded from transformers' generate() instead of our own\n"
          "RNG and prints {\"tokens\": [...], \"steps\": [...], \"stop\": [...]}.",
          specs);
  if (!f.parse(args)) {
    std::cout << f.usage();
    return 0;
  }
  auto model = load_model(f.required("model"), false);
  const auto& cfg = model->config();
  if (!cfg.is_diffusion()) throw UsageError("replay needs a DiffusionGemma checkpoint");
  const std::string draws_path = f.required("draws");
  const auto draws = dg::io::load_draws(draws_path);
  if (draws.prompt_ids.empty()) {
    throw dg::Error(dg::StatusCode::kFormatError, draws_path + ": tensor 'prompt_ids' is missing or empty");
  }
  for (std::size_t i = 0; i < draws.prompt_ids.size(); ++i) {
    if (draws.prompt_ids[i] >= cfg.vocab_size) {
      throw dg::Error(dg::StatusCode::kFormatError,
                      draws_path + ": 'prompt_ids'[" + std::to_string(i) + "] = " + std::to_string(draws.prompt_ids[i]) +
                          " is outside the vocabulary [0, " + std::to_string(cfg.vocab_size) + ") of " + cfg.source);
    }
  }
  const std::int64_t prompt_length = static_cast<std::int64_t>(draws.prompt_ids.size());
  if (prompt_length + cfg.canvas_length > cfg.max_position_embeddings) {
    throw dg::Error(dg::StatusCode::kFormatError,
                    draws_path + ": 'prompt_ids' has " + std::to_string(prompt_length) + " tokens, which leave no room for a canvas of " +
                        std::to_string(cfg.canvas_length) + " before max_position_embeddings " +
                        std::to_string(cfg.max_position_embeddings) + " of " + cfg.source + " (a recording of another model?)");
  }
  using ReplayDecoder = dg::Decoder<dg::cpu::Engine<dg::DiffusionGemmaBackbone>, dg::ReplaySampler>;
  auto o = ReplayDecoder::default_options(model->generation_config());
  apply_sampler_flags(f, cfg.vocab_size, o);
  o.sampler.rng.draws = draws.draws;
  ReplayDecoder decoder(model, engine_options(f, dg::cpu::Precision::kExact));
  const auto r = decoder.generate(draws.prompt_ids, o);
  // Every recorded draw must have been read, each canvas's at its length: a recording of another
  // model or settings can otherwise replay to the end and print tokens that mean nothing.
  // transformers also draws the renoise tokens of a canvas's last step, which nothing reads once
  // the canvas has converged: a renoise tensor whose step's samples were used may stay unread.
  std::vector<std::string> unused;
  for (const std::string& name : draws.draws->unused()) {
    const std::size_t dot = name.rfind(".renoise");
    if (dot == std::string::npos || dot + 8 != name.size() ||
        draws.draws->was_used(name.substr(0, dot) + ".sample") == false) {
      unused.push_back(name);
    }
  }
  if (!unused.empty()) {
    throw dg::Error(dg::StatusCode::kFormatError,
                    draws_path + ": " + std::to_string(unused.size()) + " recorded tensor" + (unused.size() == 1 ? "" : "s") +
                        " not used by this replay (first '" + unused.front() + "'): the recording went further than " +
                        "this generation (" + std::to_string(r.canvases.size()) + " canvases, " +
                        std::to_string(r.steps.size()) + " steps); another model, prompt or sampler settings?");
  }
  for (const auto& [name, values] : draws.draws->tensors) {
    const std::size_t canvas = std::stoul(name.substr(7));  // "canvas.{b}...": is_draws_tensor_name checked the form
    const int length = canvas < r.canvases.size() ? r.canvases[canvas].length : -1;
    if (static_cast<std::int64_t>(values.size()) != length) {
      throw dg::Error(dg::StatusCode::kFormatError, draws_path + ": tensor '" + name + "' has " +
                                                        std::to_string(values.size()) + " draws for canvas " +
                                                        std::to_string(canvas) + " of length " + std::to_string(length));
    }
  }
  nlohmann::json j;
  j["tokens"] = r.tokens;
  std::vector<int> steps;
  std::vector<std::string> stop;
  for (const auto& c : r.canvases) {
    steps.push_back(c.steps);
    stop.push_back(dg::to_string(c.stop));
  }
  j["steps"] = steps;
  j["stop"] = stop;
  std::cout << j.dump() << "\n";
  return 0;
}

}  // namespace dgemma
