// SPDX-License-Identifier: Apache-2.0
// The real-scale correctness check of the GPU back-end (scripts/gpu-check.sh): a model with the
// released 26B-A4B widths and a few layers, its BF16 weights generated from a seed so that the
// CPU (here, at build time) and the GPU machine make the same bits without carrying them, one
// scenario run by both back-ends, and the CPU's outputs carried as a compact file.
//
// The scenario: a prompt longer than the sliding window (encoded in chunks), one denoiser pass
// over a random canvas with the materialised LM head (argmax, top-8 logits and entropy per
// position, a few whole rows), two streaming denoise steps (the second fed the first's soft
// embedding: self-conditioning), and one sampled generation of a canvas.
//
// This header is host-only and free of Eigen and CUDA: realscale_host.cpp (host compiler) holds the
// CPU side, realscale.cu (nvcc) the GPU side; realscale_run.hpp is the scenario both run.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <diffusion_gemma/model/config.hpp>
#include <diffusion_gemma/model/weights.hpp>

namespace dg_realscale {

struct Scenario {
  int layers = 3;              // two sliding layers and a full one
  int prompt = 1100;           // longer than the 1024-token window
  std::uint64_t seed = 2026;   // weights, prompt, canvas and draws
  int generation_prompt = 64;  // the sampled generation's prompt: the first tokens of `prompt`
  int generation_steps = 8;    // denoising steps of its one canvas
};

// Per-position outputs, and what a back-end produced for the whole scenario.
struct Outputs {
  std::vector<float> prompt_last_hidden;  // [H]: final-normed hidden state of the prompt's last token
  std::vector<std::int32_t> argmax;       // [C] of the materialised logits
  std::vector<std::int32_t> top_ids;      // [C, 8], largest first
  std::vector<float> top_logits;          // [C, 8]
  std::vector<float> at_reference_top;    // [C, 8]: this back-end's logits at the reference's top_ids
  std::vector<float> entropy;             // [C], nats, temperature 1
  std::vector<std::int32_t> full_rows_at; // positions whose whole row is kept
  std::vector<float> full_rows;           // [rows, V]
  std::vector<std::int32_t> step1_argmax, step1_sample, step2_argmax;
  std::vector<float> step1_entropy, step2_entropy;
  std::vector<std::int32_t> generation;  // the committed canvas
  std::int32_t generation_forwards = 0;
};

// What a back-end is compared on, and the limits it must stay within.
struct Tolerance {
  double logit = 0.0;      // max |logit difference| over each position's top 8 and the whole rows
  double entropy = 0.0;    // max |entropy difference|, materialised and streaming
  double hidden = 0.0;     // max |difference| / max |value| of the prompt's last hidden state
  double agreement = 0.0;  // least fraction of argmax positions (streaming steps) and sampled tokens that agree
};

struct Comparison {
  double logit_max_abs = 0.0, entropy_max_abs = 0.0, hidden_rel = 0.0;
  int argmax_mismatches = 0;              // materialised logits, all positions
  int argmax_mismatches_unexplained = 0;  // ... where the reference's top-2 gap exceeds 2 x tolerance.logit
  double step1_argmax_agreement = 0.0, step2_argmax_agreement = 0.0, step_entropy_max_abs = 0.0;
  double generation_agreement = 0.0;
  int generation_forwards_reference = 0, generation_forwards = 0;
  bool pass = false;
  std::string failures;  // which limits were exceeded
};

using Progress = std::function<void(const std::string&)>;

// The configuration: synthetic "real" widths at s.layers layers.
diffusion_gemma::ModelConfig scenario_config(const Scenario& s);

// BF16 weights from the seed, owned by `holder`: matrices ~ N(0, 1/fan_in), the embedding std
// 0.03 (so tied-head logits have a spread of a few units), norm weights ~ 1 +- 0.1 except q/k
// norms ~ 0.25 (attention scores of unit spread), layer scalars ~ 0.8, the router std 1 (routing
// logits of unit spread, so tokens spread over the experts and the top 8 are not near ties). Element i of
// tensor k depends on (seed, k, i) alone: any thread count makes the same bits.
struct SeededWeights {
  diffusion_gemma::ModelWeights weights;
  std::shared_ptr<const void> holder;
};
SeededWeights make_weights(const diffusion_gemma::ModelConfig& cfg, std::uint64_t seed);

std::vector<std::int32_t> prompt_ids(const Scenario& s, std::int64_t vocab);
std::vector<std::int32_t> canvas_ids(const Scenario& s, std::int64_t vocab, int canvas);

// argmax, top 8, entropy and whole rows of materialised logits [C, V] (host), into `out`;
// `reference_top` (the reference's top_ids, or empty) selects at_reference_top.
void summarize_logits(const float* logits, std::int64_t C, std::int64_t V, const std::vector<std::int32_t>& reference_top,
                      Outputs& out);

// The CPU back-end on the scenario: `exact` (fp32 activations, the reference) or fast (BF16
// activations where the CPU has them).
Outputs run_cpu(const Scenario& s, const diffusion_gemma::ModelConfig& cfg, const SeededWeights& w, bool exact,
                const std::vector<std::int32_t>& reference_top, const Progress& progress);

// The CPU's model name and the kernel path the CPU back-end uses on it.
std::string cpu_description();

// The reference file: the scenario, the exact CPU outputs, and the fast CPU outputs (which
// calibrate what BF16 activations alone cost on this model).
struct Reference {
  Scenario scenario;
  Outputs exact, fast;
  std::string cpu;  // CPU model and kernel path it was computed with
};
void save_reference(const std::string& path, const Reference& r);
Reference load_reference(const std::string& path);

Comparison compare(const Outputs& reference, const Outputs& got, const Tolerance& t);
std::string to_json(const Comparison& c, const Tolerance& t);

}  // namespace dg_realscale
