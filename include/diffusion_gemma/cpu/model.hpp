// SPDX-License-Identifier: Apache-2.0
// cpu::Model: a loaded checkpoint, immutable after load and safe to share between threads (each
// thread runs its own cpu::Engine over it). Matrices stay in the checkpoint's dtype and layout,
// used in place from the memory map (io/load.hpp): a BF16 checkpoint costs its BF16 bytes of
// memory, once, shared with the page cache. Only the vectors (norm weights, router scales, layer
// scalars: a few KiB per layer) are widened to fp32 copies, since every use reads them as fp32.
// Engines that multiply on AMX tiles, and AVX2 and AVX-512 engines on BF16 matrices, use a copy of the matrices
// packed as pair tiles instead (tiled_weights, paired_weights), which takes the place of the mapped
// pages it was made from.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <sys/mman.h>

#include <diffusion_gemma/core/status.hpp>
#include <diffusion_gemma/cpu/tile_pack.hpp>
#include <diffusion_gemma/io/load.hpp>
#include <diffusion_gemma/model/config.hpp>
#include <diffusion_gemma/model/weights.hpp>

namespace diffusion_gemma::cpu {

// Progress of a long load: (bytes done, bytes total) while the weights are read into memory.
using LoadProgress = std::function<void(std::size_t, std::size_t)>;

class Model {
 public:
  // Loads config.json, generation_config.json and the weights of a checkpoint directory, and
  // reads every weight page once (so the first step does not page-fault its way through the
  // file), reporting progress by bytes. `check_finite` also scans every weight for NaN/Inf.
  static std::shared_ptr<const Model> load(const std::string& dir, const LoadProgress& progress = {},
                                           bool check_finite = false) {
    io::LoadOptions options;
    options.check_finite = check_finite;
    auto m = std::shared_ptr<Model>(new Model(io::load_checkpoint(dir, options)));
    m->prefault(progress);
    return m;
  }

  // A model from weights made in memory (research code, generated checkpoints such as the GPU
  // check's seeded real-width model): every Weight must own its bytes (`owner`) or outlive the
  // model. Each tensor the config implies must be present with exactly its shape; the first one
  // that is not is named.
  static std::shared_ptr<const Model> create(ModelConfig cfg, ModelWeights weights, GenerationConfig generation = {}) {
    cfg.validate();
    if (weights.layers.size() != cfg.layers.size()) {
      throw_error(StatusCode::kInvalidArgument, "cpu::Model::create: ", weights.layers.size(), " layers of weights for ",
                  cfg.layers.size(), " layers in the config");
    }
    for_each_parameter(cfg, weights, [&](const ParamSpec& p, const Weight& w) {
      if (w.empty()) throw_error(StatusCode::kInvalidArgument, "cpu::Model::create: ", p.name, " is missing");
      if (!(w.shape == p.shape)) {
        throw_error(StatusCode::kInvalidArgument, "cpu::Model::create: ", p.name, " has shape ", w.shape.str(),
                    ", the config implies ", p.shape.str());
      }
    });
    io::LoadedCheckpoint c;
    c.dir = cfg.source;
    c.embed_scale = embedding_scale(cfg.hidden_size, model_dtype(cfg, weights));
    c.config = std::move(cfg);
    c.generation = std::move(generation);
    c.weights = std::move(weights);
    return std::shared_ptr<Model>(new Model(std::move(c)));
  }

  const ModelConfig& config() const { return ckpt_.config; }
  const GenerationConfig& generation_config() const { return ckpt_.generation; }
  const std::string& dir() const { return ckpt_.dir; }
  const io::BindReport& bind_report() const { return ckpt_.report; }
  const ModelWeights& weights() const { return ckpt_.weights; }
  const LayerWeights& layer(int l) const { return ckpt_.weights.layers[static_cast<std::size_t>(l)]; }
  bool has_self_conditioning() const { return ckpt_.weights.self_conditioning.present(); }
  float embed_scale() const { return ckpt_.embed_scale; }
  DType weight_dtype() const { return ckpt_.weights.embed_tokens.dtype; }
  const io::QuantizationConfig& quantization() const { return ckpt_.quantization; }

  // The fp32 copy of a vector parameter (a norm weight or router scale) of layer `layer` (-1:
  // outside the layers); nullptr when the model has no such tensor.
  const float* vector(int layer, Param p) const {
    const std::size_t i = slot(layer, p);
    return i < vectors_.size() && !vectors_[i].empty() ? vectors_[i].data() : nullptr;
  }
  float layer_scalar(int l) const { return *vector(l, Param::kLayerScalar); }

  // The weights with the matrices the fast engines multiply in bf16 (AMX tiles, AVX512-BF16 dot
  // products) also packed into tiles, F32 and F16 ones rounded to bf16
  // (cpu/tile_pack.hpp): made on the first call (thread-safe) and shared by every such engine on
  // this model. The mapped pages of the packed matrices are released once packed. The first
  // caller's `threads` (as EngineOptions::threads; 0: default_threads()) do the packing.
  const ModelWeights& tiled_weights(int threads = 0) const {
    std::call_once(tiled_once_, [&] {
      tiled_ = std::make_unique<const ModelWeights>(
          pack_for_tiles(ckpt_.weights, ckpt_.checkpoint != nullptr, TilePacking::kAllRoundedToBf16, threads));
    });
    return *tiled_;
  }

  // The weights whose BF16 matrices (the same list) are also packed as pair tiles, losslessly, for
  // the AVX2 and AVX-512 kernels; the tiled_weights() object itself when every such matrix is BF16.
  const ModelWeights& paired_weights(int threads = 0) const {
    if (packable_matrices_all_bf16(ckpt_.weights)) return tiled_weights(threads);
    std::call_once(paired_once_, [&] {
      paired_ = std::make_unique<const ModelWeights>(
          pack_for_tiles(ckpt_.weights, ckpt_.checkpoint != nullptr, TilePacking::kBf16Only, threads));
    });
    return *paired_;
  }

  // Bytes of all parameters as bound (in the model's dtype), and of the fp32 vector copies.
  std::size_t weight_bytes() const { return weight_bytes_; }
  std::size_t owned_bytes() const { return owned_bytes_; }

 private:
  explicit Model(io::LoadedCheckpoint c) : ckpt_(std::move(c)) {
    const std::size_t layers = ckpt_.config.layers.size();
    vectors_.resize((layers + 1) * static_cast<std::size_t>(Param::kSentinel));
    for_each_parameter(ckpt_.config, ckpt_.weights, [&](const ParamSpec& p, const Weight& w) {
      weight_bytes_ += w.nbytes();
      if (p.is_matrix() || w.empty()) return;
      std::vector<float>& v = vectors_[slot(p.layer, p.param)];
      v.resize(static_cast<std::size_t>(w.numel()));
      for (std::int64_t i = 0; i < w.numel(); ++i) v[static_cast<std::size_t>(i)] = w.at(i);
      owned_bytes_ += v.size() * sizeof(float);
    });
  }

  static std::size_t slot(int layer, Param p) {
    return static_cast<std::size_t>(layer + 1) * static_cast<std::size_t>(Param::kSentinel) + static_cast<std::size_t>(p);
  }

  // Reads one byte per page of every matrix, in file order, asking the kernel to read ahead.
  void prefault(const LoadProgress& progress) const {
    std::size_t done = 0;
    volatile unsigned char sink = 0;
    for_each_parameter(ckpt_.config, ckpt_.weights, [&](const ParamSpec&, const Weight& w) {
      w.for_each_buffer([&](const std::byte* data, std::size_t bytes) {
        const std::size_t page = 4096;
        const auto begin = reinterpret_cast<std::uintptr_t>(data) / page * page;
        ::madvise(reinterpret_cast<void*>(begin), bytes + (reinterpret_cast<std::uintptr_t>(data) - begin), MADV_WILLNEED);
        for (std::size_t off = 0; off < bytes; off += page) {
          sink = sink + static_cast<unsigned char>(data[off]);
          if (progress && (off / page) % 16384 == 0) progress(done + off, weight_bytes_);
        }
        done += bytes;
      });
    });
    if (progress) progress(weight_bytes_, weight_bytes_);
  }

  io::LoadedCheckpoint ckpt_;
  mutable std::once_flag tiled_once_;
  mutable std::unique_ptr<const ModelWeights> tiled_;
  mutable std::once_flag paired_once_;
  mutable std::unique_ptr<const ModelWeights> paired_;
  std::vector<std::vector<float>> vectors_;
  std::size_t weight_bytes_ = 0;
  std::size_t owned_bytes_ = 0;
};

}  // namespace diffusion_gemma::cpu
