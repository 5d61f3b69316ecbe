// SPDX-License-Identifier: Apache-2.0
// The one loader both back-ends use: a checkpoint directory (config.json, generation_config.json,
// safetensors shards) becomes the parsed configs, the memory maps and the bound ModelWeights
// (views into the maps, in the stored dtype, except a tensor stored in another dtype than a 16-bit
// model's, which is converted to it as transformers converts it). cpu::Model computes with the views in place;
// cuda::Model::create uploads them.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <diffusion_gemma/core/bfloat16.hpp>
#include <diffusion_gemma/core/float16.hpp>
#include <diffusion_gemma/core/tensor_view.hpp>
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
  std::shared_ptr<const Checkpoint> checkpoint;  // the maps the borrowed Weights of `weights` point into
  ModelWeights weights;
  BindReport report;
  float embed_scale = 1.0f;  // embedding_scale(hidden, model_dtype())
};

// A dense weight stored in another dtype than a 16-bit model's, converted to it (round to nearest
// even, as torch's `.to()`) in 64-byte aligned bytes the weight owns; a float32 model holds every
// stored value exactly, so its weights are used in place. With `check_finite`, a finite value the
// conversion makes infinite (past float16's 65504) is refused by name.
inline Weight narrowed(const Weight& w, DType to, const std::string& name, bool check_finite) {
  if (w.empty() || !w.is_dense() || w.dtype == to || (to != DType::kBF16 && to != DType::kF16)) return w;
  RawTensor stored;
  stored.data = w.data;
  stored.dtype = w.dtype;
  stored.shape = w.shape;
  const std::size_t n = static_cast<std::size_t>(w.shape.numel());
  const std::size_t bytes = (n * sizeof(std::uint16_t) + 63) / 64 * 64;
  void* memory = std::aligned_alloc(64, bytes > 0 ? bytes : 64);
  if (memory == nullptr) throw_error(StatusCode::kOutOfMemory, name, ": cannot allocate ", bytes, " bytes to convert it");
  const std::shared_ptr<std::uint16_t> bits(static_cast<std::uint16_t*>(memory), [](std::uint16_t* p) { std::free(p); });
  for (std::size_t i = 0; i < n; ++i) {
    const float v = load_as_float(stored, static_cast<std::int64_t>(i));
    bits.get()[i] = to == DType::kBF16 ? bfloat16::from_float(v).bits : float16::from_float(v).bits;
    if (check_finite && to == DType::kF16 && std::isfinite(v) && std::fabs(v) >= 65520.0f) {
      throw_error(StatusCode::kFormatError, name, ": value ", v, " at flat index ", i,
                  " is past float16's range, which config.json's dtype makes it");
    }
  }
  Weight out = w;
  out.data = reinterpret_cast<const std::byte*>(bits.get());
  out.dtype = to;
  out.owner = std::shared_ptr<const void>(bits, bits.get());
  return out;
}

// transformers loads every parameter in the model's dtype: an F32 tensor of a bfloat16 model is
// rounded to bfloat16 (a checkpoint saved in F32 with the config's dtype left at bfloat16 runs as
// the bfloat16 model). Quantized weights keep their own encoding.
inline void narrow_to_model_dtype(const ModelConfig& config, DType dtype, ModelWeights& weights,
                                  bool check_finite = false) {
  for_each_parameter(config, weights, [&](const ParamSpec& p, Weight& w) {
    if (w.is_split()) {
      std::vector<Weight> parts;
      bool changed = false;
      for (const Weight& part : *w.parts) {
        parts.push_back(narrowed(part, dtype, p.name, check_finite));
        changed = changed || parts.back().dtype != part.dtype;
      }
      if (changed) w = Weight::split(w.shape, std::move(parts));
    } else {
      w = narrowed(w, dtype, p.name, check_finite);
    }
  });
}

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
  const DType dtype = model_dtype(c.config, c.weights);
  narrow_to_model_dtype(c.config, dtype, c.weights, options.check_finite);
  c.embed_scale = embedding_scale(c.config.hidden_size, dtype);
  return c;
}

}  // namespace diffusion_gemma::io
