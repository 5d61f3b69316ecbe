// SPDX-License-Identifier: Apache-2.0
// Must NOT compile: a State policy whose optional can_implement returns bool. Sampler would skip it
// (only `static Status can_implement(const Arguments&)` is called), so it must say so instead.
#include <cstdint>

#include <diffusion_gemma/sampler/sampler.hpp>

namespace dg = diffusion_gemma;

struct MaskState {
  struct Arguments {
    std::int32_t mask = 0;
  };
  static bool can_implement(const Arguments& a) { return a.mask >= 0; }
  template <class Rng>
  static void init(const Arguments& a, const Rng&, int, std::int64_t, std::int32_t* out, int length) {
    for (int i = 0; i < length; ++i) out[i] = a.mask;
  }
  template <class Rng>
  static std::int32_t renoise(const Arguments& a, const Rng&, int, int, int, std::int64_t) {
    return a.mask;
  }
};

int main() {
  dg::Sampler<MaskState>::Arguments a;
  (void)a;
}
