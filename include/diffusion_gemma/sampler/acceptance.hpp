// SPDX-License-Identifier: Apache-2.0
// Acceptance policies: which positions keep their sampled candidate this step (the rest are
// renoised). Decided from scratch every step: nothing is locked.
#pragma once

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <vector>

#include <diffusion_gemma/core/math.hpp>
#include <diffusion_gemma/core/status.hpp>

namespace diffusion_gemma {

// What a step knows about each position when acceptance is decided.
struct StepView {
  const std::int32_t* argmax;
  const std::int32_t* candidate;
  const float* entropy;
  int length;
  int step;             // 0-based
  int steps_remaining;  // N - step
};

// Entropy bound (arXiv 2505.24857, transformers' EntropyBoundSampler): sort positions by entropy
// (ties: lower position first) and accept the k lowest while the sum of the strictly earlier
// entropies is <= bound. At least one position is always accepted.
struct EntropyBound {
  struct Arguments {
    double entropy_bound = 0.1;
  };
  static Status can_implement(const Arguments& a) {
    if (!(a.entropy_bound > 0.0)) return make_status(StatusCode::kInvalidArgument, "entropy bound must be > 0 (got ", a.entropy_bound, ")");
    return {};
  }
  struct State {
    std::vector<int> order;
  };
  static void accept(const Arguments& a, const StepView& s, State& st, std::uint8_t* accepted) {
    st.order.resize(static_cast<std::size_t>(s.length));
    std::iota(st.order.begin(), st.order.end(), 0);
    std::stable_sort(st.order.begin(), st.order.end(), [&](int x, int y) { return s.entropy[x] < s.entropy[y]; });
    const float bound = static_cast<float>(a.entropy_bound);
    double cum = 0.0;
    for (int i = 0; i < s.length; ++i) accepted[i] = 0;
    for (int k = 0; k < s.length; ++k) {
      const int p = st.order[static_cast<std::size_t>(k)];
      cum += s.entropy[p];
      accepted[p] = math::entropy_bound_accepts(cum, s.entropy[p], bound) ? 1 : 0;
    }
  }
};

}  // namespace diffusion_gemma
