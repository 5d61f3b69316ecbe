// SPDX-License-Identifier: Apache-2.0
// Must NOT compile: a Stopping policy whose State has no default constructor. Every request starts
// from State{}, so Sampler must say so instead of failing inside runtime/sequence.hpp.
#include <diffusion_gemma/sampler/sampler.hpp>

namespace dg = diffusion_gemma;

struct StopAfter {
  struct Arguments {
    int steps = 4;
  };
  static dg::Status can_implement(const Arguments& a) {
    return a.steps > 0 ? dg::Status{} : dg::Status(dg::StatusCode::kInvalidArgument, "steps must be positive");
  }
  struct State {
    explicit State(int budget) : left(budget) {}
    int left;
  };
  static void reset(const Arguments& a, State& st) { st.left = a.steps; }
  static bool update(const Arguments&, const dg::StepView&, State& st) { return --st.left <= 0; }
};

int main() {
  dg::Sampler<dg::UniformState, dg::SelfConditioning, dg::EntropyBound, dg::LinearTemperature, StopAfter>::Arguments a;
  (void)a;
}
