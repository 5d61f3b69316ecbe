// SPDX-License-Identifier: Apache-2.0
// What a generation reports: one record per denoising step and per canvas, and the result.
// io/trace_json.hpp writes them as JSON lines.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace diffusion_gemma {

enum class CanvasStop {
  kConverged,  // the stopping rule fired (reference: stable and confident)
  kMaxSteps,   // ran all max_denoising_steps
  kCancelled,  // a callback asked to stop
  kSentinel
};

enum class Finish {
  kStopToken,     // a committed canvas contained a stop id
  kMaxNewTokens,  // every planned canvas was committed
  kCancelled,
  kSentinel
};

inline const char* to_string(CanvasStop s) {
  switch (s) {
    case CanvasStop::kConverged: return "converged";
    case CanvasStop::kMaxSteps: return "max_steps";
    case CanvasStop::kCancelled: return "cancelled";
    case CanvasStop::kSentinel: break;
  }
  return "?";
}

inline const char* to_string(Finish f) {
  switch (f) {
    case Finish::kStopToken: return "stop_token";
    case Finish::kMaxNewTokens: return "max_new_tokens";
    case Finish::kCancelled: return "cancelled";
    case Finish::kSentinel: break;
  }
  return "?";
}

struct StepRecord {
  int canvas = 0;
  int step = 0;             // 0-based
  int steps_remaining = 0;  // N - step
  float temperature = 0.0f;
  int accepted = 0;         // positions that kept their sampled candidate
  float mean_entropy = 0.0f;
  float max_entropy = 0.0f;
  int draft_changes = 0;    // argmax positions that differ from the previous step's (all on step 0)
  bool stable = false;
  bool confident = false;
  double seconds = 0.0;     // wall time of this step (denoise + vocabulary pass + sampler)
};

struct CanvasRecord {
  int canvas = 0;
  std::int64_t position = 0;  // first position of the canvas
  int length = 0;
  int steps = 0;
  CanvasStop stop = CanvasStop::kMaxSteps;
  int valid_tokens = 0;       // up to and including a stop id
  bool stop_token = false;
  double seconds = 0.0;       // denoising + commit
};

struct GenerationResult {
  std::vector<std::int32_t> tokens;  // whole canvases, PAD after the first stop id (transformers' output)
  std::vector<CanvasRecord> canvases;
  std::vector<StepRecord> steps;
  Finish finish = Finish::kMaxNewTokens;
  int forwards = 0;                  // denoiser passes
  double tokens_per_forward = 0.0;   // non-PAD generated tokens / denoiser passes (transformers' metric)
  double seconds = 0.0;
  double prefill_seconds = 0.0;
  double first_commit_seconds = 0.0;  // from the call to the first committed canvas

  // The generated tokens a user reads: up to and including the first stop id. An autoregressive
  // result has no canvases, and its tokens already end at the stop id.
  std::vector<std::int32_t> text_tokens() const {
    if (canvases.empty()) return tokens;
    std::vector<std::int32_t> out;
    std::size_t offset = 0;
    for (const auto& c : canvases) {
      out.insert(out.end(), tokens.begin() + static_cast<std::ptrdiff_t>(offset),
                 tokens.begin() + static_cast<std::ptrdiff_t>(offset + static_cast<std::size_t>(c.valid_tokens)));
      if (c.stop_token) break;
      offset += static_cast<std::size_t>(c.length);
    }
    return out;
  }
};

}  // namespace diffusion_gemma
