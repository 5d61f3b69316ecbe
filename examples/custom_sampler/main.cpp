// SPDX-License-Identifier: Apache-2.0
// A research sampler in a few lines: a new acceptance rule and a new stopping rule, composed
// with the reference policies at compile time and run on the CPU back-end.
//   custom_sampler [MODEL_DIR ["question"]]   (default: the bundled model)
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <optional>
#include <string>
#include <vector>

#include <diffusion_gemma/cpu/engine.hpp>
#include <diffusion_gemma/io/chat_format.hpp>
#include <diffusion_gemma/io/tokenizer.hpp>
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

// Runs one decoder and prints how each canvas ended, then the text (or the ids, for a checkpoint
// without a tokenizer).
template <class Decoder>
void run(const char* name, Decoder& d, typename Decoder::Options o, const std::vector<std::int32_t>& prompt,
         const dg::io::Tokenizer* tokenizer) {
  o.scheduler.max_new_tokens = 2 * d.engine().config().canvas_length;
  o.sampler.rng.seed = 7;
  const dg::GenerationResult r = d.generate(prompt, o);
  std::printf("%-10s steps per canvas:", name);
  for (const auto& c : r.canvases) std::printf(" %d (%s)", c.steps, dg::to_string(c.stop));
  std::printf("; tokens/forward %.2f\n  ", r.tokens_per_forward);
  const std::vector<std::int32_t> out = r.text_tokens();
  if (tokenizer != nullptr) {
    std::printf("%s\n", tokenizer->decode(std::vector<int>(out.begin(), out.end())).c_str());
  } else {
    for (auto t : out) std::printf(" %d", t);
    std::printf("\n");
  }
}

int main(int argc, char** argv) {
  const std::string dir = argc > 1 ? argv[1] : DG_EXAMPLE_MODEL_DIR;
  const std::string question = argc > 2 ? argv[2] : "Sort ascending: 93 44 60 89 20";
  try {
    const auto model = dg::cpu::Model::load(dir);
    // A checkpoint with a tokenizer gets a chat prompt and prints text; test checkpoints without
    // one get a few fixed ids.
    std::optional<dg::io::Tokenizer> tokenizer;
    std::vector<std::int32_t> prompt{2, 10, 20, 30};
    if (std::ifstream(dir + "/tokenizer.json").good()) {
      tokenizer = dg::io::Tokenizer::from_file(dir + "/tokenizer.json");
      const std::vector<int> ids = dg::io::encode_chat(*tokenizer, {{"user", question}});
      prompt.assign(ids.begin(), ids.end());
    }
    const dg::io::Tokenizer* tok = tokenizer ? &*tokenizer : nullptr;

    dg::Decoder<Engine> reference(model);
    run("reference", reference, reference.default_options(model->generation_config()), prompt, tok);

    dg::Decoder<Engine, MySampler> mine(model);
    auto o = mine.default_options(model->generation_config());
    o.sampler.acceptance.threshold = 0.3;
    o.sampler.stopping.patience = 3;
    run("custom", mine, o, prompt, tok);
  } catch (const dg::Error& e) {
    std::fprintf(stderr, "custom_sampler: error: %s\n", e.what());
    return 1;
  }
  return 0;
}
