// SPDX-License-Identifier: Apache-2.0
// The one loader both back-ends use: a checkpoint directory (config.json, generation_config.json,
// safetensors shards) becomes the parsed configs, the memory maps and the bound ModelWeights
// (views into the maps, in the stored dtype). cpu::Model computes with the views in place;
// cuda::Model::create uploads them.
#pragma once

#include <memory>
#include <string>

#include <diffusion_gemma/io/config.hpp>
#include <diffusion_gemma/io/quantization_config.hpp>
#include <diffusion_gemma/io/safetensors.hpp>
#include <diffusion_gemma/io/weights.hpp>
#include <diffusion_gemma/model/config.hpp>
#include <diffusion_gemma/model/weights.hpp>

namespace diffusion_gemma::io {

struct LoadOptions {
  bool check_finite = false;  // scan every weight for NaN/Inf first (reads the whole checkpoint)
};

struct LoadedCheckpoint {
  std::string dir;
  ModelConfig config;
  GenerationConfig generation;
  QuantizationConfig quantization;
  std::shared_ptr<const Checkpoint> checkpoint;  // the maps every Weight in `weights` points into
  ModelWeights weights;
  BindReport report;
  float embed_scale = 1.0f;  // embedding_scale(hidden, dtype of embed_tokens)
};

inline LoadedCheckpoint load_checkpoint(const std::string& dir, const LoadOptions& options = {}) {
  LoadedCheckpoint c;
  c.dir = dir;
  c.config = load_model_config(dir);
  c.generation = load_generation_config(dir);
  c.generation.restrict_to_vocabulary(c.config.vocab_size);
  c.quantization = load_quantization_config(dir);
  auto ckpt = std::make_shared<Checkpoint>(dir);
  if (options.check_finite) check_weights_finite(*ckpt);
  c.weights = bind_weights(*ckpt, c.config, c.quantization, &c.report);
  c.checkpoint = std::move(ckpt);
  c.embed_scale = embedding_scale(c.config.hidden_size, c.weights.embed_tokens.dtype);
  return c;
}

}  // namespace diffusion_gemma::io
