// SPDX-License-Identifier: Apache-2.0
// Acceptance policies: which positions keep their sampled candidate this step (the rest are
// renoised). Decided from scratch every step: nothing is locked.
#pragma once

#include <algorithm>
#include <cstdint>
#include <utility>
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
// and accept the k lowest while the sum of the strictly earlier entropies is <= bound. At least one
// position is always accepted. Equal entropies are ordered as transformers orders them on the CPU:
// torch.sort(stable=False) runs std::sort on (entropy, position) pairs compared by entropy alone,
// so the same std::sort on the same pairs gives the same order (libstdc++; checked against torch
// 2.15 on tie-heavy rows of 8 to 1000 entries). A tie at the bound decides which of two equally
// certain positions is accepted.
struct EntropyBound {
  struct Arguments {
    double entropy_bound = 0.1;
  };
  static Status can_implement(const Arguments& a) {
    if (!(a.entropy_bound > 0.0)) return make_status(StatusCode::kInvalidArgument, "entropy bound must be > 0 (got ", a.entropy_bound, ")");
    return {};
  }
  struct State {
    std::vector<std::pair<float, std::int64_t>> order;  // (entropy, position), as torch sorts them
  };
  static void accept(const Arguments& a, const StepView& s, State& st, std::uint8_t* accepted) {
    st.order.resize(static_cast<std::size_t>(s.length));
    for (int i = 0; i < s.length; ++i) st.order[static_cast<std::size_t>(i)] = {s.entropy[i], i};
    std::sort(st.order.begin(), st.order.end(),
              [](const std::pair<float, std::int64_t>& x, const std::pair<float, std::int64_t>& y) {
                return x.first < y.first;
              });
    const float bound = static_cast<float>(a.entropy_bound);
    double cum = 0.0;
    for (int i = 0; i < s.length; ++i) accepted[i] = 0;
    for (int k = 0; k < s.length; ++k) {
      const int p = static_cast<int>(st.order[static_cast<std::size_t>(k)].second);
      cum += s.entropy[p];
      accepted[p] = math::entropy_bound_accepts(cum, s.entropy[p], bound) ? 1 : 0;
    }
  }
};

}  // namespace diffusion_gemma
