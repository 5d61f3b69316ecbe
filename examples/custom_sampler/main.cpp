// SPDX-License-Identifier: Apache-2.0
// A research sampler in a few lines: a new acceptance rule and a new stopping rule, composed
// with the reference policies at compile time and run on the CPU back-end.
//   custom_sampler [MODEL_DIR]
#include <cstdint>
#include <cstdio>
#include <deque>
#include <vector>

#include <diffusion_gemma/cpu/engine.hpp>
#include <diffusion_gemma/runtime/decoder.hpp>

namespace dg = diffusion_gemma;

// Accept every position whose entropy is below a threshold (at least the most certain one).
struct EntropyThreshold {
  struct Arguments { double threshold = 0.5; };
  struct State {};
  static dg::Status can_implement(const Arguments& a) {
    return a.threshold > 0 ? dg::Status{} : dg::make_status(dg::StatusCode::kInvalidArgument, "threshold <= 0");
  }
  static void accept(const Arguments& a, const dg::StepView& s, State&, std::uint8_t* accepted) {
    int best = 0;
    for (int i = 0; i < s.length; ++i) {
      accepted[i] = s.entropy[i] < a.threshold;
      if (s.entropy[i] < s.entropy[best]) best = i;
    }
    accepted[best] = 1;
  }
};

// Stop once the argmax draft has not changed for `patience` consecutive steps.
struct UnchangedDraft {
  struct Arguments { int patience = 2; };
  struct State { std::vector<std::int32_t> last; int unchanged = 0; };
  static dg::Status can_implement(const Arguments&) { return {}; }
  static void reset(const Arguments&, State& st) { st = State{}; }
  static bool update(const Arguments& a, const dg::StepView& s, State& st) {
    const std::vector<std::int32_t> now(s.argmax, s.argmax + s.length);
    st.unchanged = now == st.last ? st.unchanged + 1 : 0;
    st.last = now;
    return st.unchanged >= a.patience;
  }
};

using Engine = dg::cpu::Engine<dg::DiffusionGemmaBackbone>;
using MySampler = dg::Sampler<dg::UniformState, dg::SelfConditioning, EntropyThreshold, dg::LinearTemperature, UnchangedDraft>;

template <class Decoder>
void run(const char* name, Decoder& d, typename Decoder::Options o, const std::vector<std::int32_t>& prompt) {
  o.scheduler.max_new_tokens = 2 * d.engine().config().canvas_length;
  o.sampler.rng.seed = 7;
  const dg::GenerationResult r = d.generate(prompt, o);
  std::printf("%-10s steps per canvas:", name);
  for (const auto& c : r.canvases) std::printf(" %d (%s)", c.steps, dg::to_string(c.stop));
  std::printf("; tokens/forward %.2f; tokens:", r.tokens_per_forward);
  for (auto t : r.tokens) std::printf(" %d", t);
  std::printf("\n");
}

int main(int argc, char** argv) {
  const auto model = dg::cpu::Model::load(argc > 1 ? argv[1] : DG_EXAMPLE_MODEL_DIR);
  const std::vector<std::int32_t> prompt{2, 10, 20, 30};
  dg::Decoder<Engine> reference(model);
  run("reference", reference, reference.default_options(model->generation_config()), prompt);
  dg::Decoder<Engine, MySampler> mine(model);
  auto o = mine.default_options(model->generation_config());
  o.sampler.acceptance.threshold = 0.3;
  o.sampler.stopping.patience = 3;
  run("custom", mine, o, prompt);
  return 0;
}
