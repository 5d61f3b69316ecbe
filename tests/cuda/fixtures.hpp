// SPDX-License-Identifier: Apache-2.0
// What the CUDA tests need from the host side, behind an interface free of Eigen, nlohmann and
// CUDA: checkpoints loaded with io/ (as dgemma does), transformers' golden tensors and replay
// runs, and the CPU back-end as the oracle. Implemented in fixtures.cpp, compiled by the host
// compiler, so that the .cu files include neither cpu/ nor io/.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <diffusion_gemma/model/config.hpp>
#include <diffusion_gemma/model/weights.hpp>
#include <diffusion_gemma/sampler/rng.hpp>
#include <diffusion_gemma/sampler/sampler.hpp>
#include <diffusion_gemma/sampler/vocab_stats.hpp>
#include <diffusion_gemma/schedule/canvas_scheduler.hpp>

namespace dg_cuda_test {

// A checkpoint on the host: weight views stay valid while `holder` lives.
struct HostCheckpoint {
  diffusion_gemma::ModelConfig config;
  diffusion_gemma::GenerationConfig generation;
  diffusion_gemma::ModelWeights weights;
  float embed_scale = 0.0f;  // embedding_scale(): sqrt(hidden) in the checkpoint's dtype
  std::shared_ptr<const void> holder;
};

// From the checkpoint directory, with io::load_checkpoint (the stored dtypes), as dgemma loads it.
HostCheckpoint load_checkpoint(const std::string& dir);

// Golden tensors written by tools/reference/make_fixtures.py.
class Golden {
 public:
  explicit Golden(const std::string& path);
  std::vector<float> floats(const std::string& name) const;
  std::vector<std::int32_t> ids(const std::string& name) const;
  bool has(const std::string& name) const;

 private:
  std::shared_ptr<const void> file_;
};

// The CPU back-end (cpu::Engine over cpu::Model) as the oracle, with its own KV cache.
class CpuReference {
 public:
  explicit CpuReference(const std::string& dir);
  ~CpuReference();
  CpuReference(const CpuReference&) = delete;
  CpuReference& operator=(const CpuReference&) = delete;

  const diffusion_gemma::ModelConfig& config() const;
  float embed_scale() const;
  const float* embed_tokens() const;  // [V, H] fp32

  void reset_cache(std::int64_t capacity);
  std::int64_t cache_length() const;
  std::vector<float> encode(const std::vector<std::int32_t>& ids);  // hidden [n, H]; appends to the cache
  std::vector<float> denoise(const std::vector<std::int32_t>& ids, const float* soft);  // hidden [n, H]
  std::vector<float> lm_head(const std::vector<float>& hidden, std::int64_t n);
  diffusion_gemma::VocabPassResult vocab_pass(const std::vector<float>& hidden, std::int64_t n,
                                              const diffusion_gemma::VocabPassArgs& args);
  diffusion_gemma::VocabPassResult denoise_step(const std::vector<std::int32_t>& canvas, bool first_step,
                                                const diffusion_gemma::VocabPassArgs& args);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// cpu::VocabPass on arbitrary data (E [V, H], hidden [C, H]).
diffusion_gemma::VocabPassResult cpu_vocab_pass(const std::vector<float>& E, std::int64_t V, std::int64_t H, float cap,
                                                float embed_scale, const std::vector<float>& hidden, std::int64_t C,
                                                const diffusion_gemma::VocabPassArgs& args);

// A generate() run recorded from transformers: prompt, draws, expected output and settings.
struct ReplayRun {
  std::vector<std::int32_t> prompt;
  std::vector<std::int32_t> tokens;
  std::vector<int> steps;
  std::vector<std::string> stop;
  diffusion_gemma::ReplaySampler::Arguments sampler;
  diffusion_gemma::CanvasScheduler<>::Arguments scheduler;
};
ReplayRun load_replay(const std::string& checkpoint_dir, const std::string& run);

}  // namespace dg_cuda_test
