// SPDX-License-Identifier: Apache-2.0
// Stopping rules of the denoising loop of one canvas, evaluated after each step.
#pragma once

#include <cstdint>
#include <deque>
#include <vector>

#include <diffusion_gemma/core/status.hpp>
#include <diffusion_gemma/sampler/acceptance.hpp>

namespace diffusion_gemma {

// transformers' StableAndConfidentStoppingCriteria. stable: the current argmax canvas equals EACH
// of the previous `stability_threshold` argmax canvases (so k means k + 1 equal canvases in a row;
// never on step 1; always when k = 0). confident: mean entropy < confidence_threshold (strict).
struct StableAndConfident {
  struct Arguments {
    int stability_threshold = 1;
    double confidence_threshold = 0.005;
  };
  static Status can_implement(const Arguments& a) {
    if (a.stability_threshold < 0) return make_status(StatusCode::kInvalidArgument, "stability threshold must be >= 0");
    if (!(a.confidence_threshold > 0.0)) return make_status(StatusCode::kInvalidArgument, "confidence threshold must be > 0");
    return {};
  }
  struct State {
    std::deque<std::vector<std::int32_t>> history;
    bool stable = false;
    bool confident = false;
  };
  static void reset(const Arguments&, State& st) {
    st.history.clear();
    st.stable = st.confident = false;
  }
  static bool update(const Arguments& a, const StepView& s, State& st) {
    const std::vector<std::int32_t> now(s.argmax, s.argmax + s.length);
    if (a.stability_threshold == 0) {
      st.stable = true;
    } else {
      // Missing history entries stand for transformers' -1 canvases: never equal.
      st.stable = static_cast<int>(st.history.size()) == a.stability_threshold;
      for (const auto& h : st.history) st.stable = st.stable && h == now;
      st.history.push_back(now);
      if (static_cast<int>(st.history.size()) > a.stability_threshold) st.history.pop_front();
    }
    double sum = 0.0;
    for (int i = 0; i < s.length; ++i) sum += s.entropy[i];
    st.confident = static_cast<float>(sum / s.length) < static_cast<float>(a.confidence_threshold);
    return st.stable && st.confident;
  }
};

// Never stops early: every canvas runs max_denoising_steps steps (TensorRT-Edge-LLM style, benchmarks).
struct FixedSteps {
  struct Arguments {};
  static Status can_implement(const Arguments&) { return {}; }
  struct State {};
  static void reset(const Arguments&, State&) {}
  static bool update(const Arguments&, const StepView&, State&) { return false; }
};

}  // namespace diffusion_gemma
