// SPDX-License-Identifier: Apache-2.0
// docs/getting-started.md quotes this file; CI builds and runs it on the bundled model.
//   getting_started MODEL_DIR "question"
#include <cstdio>
#include <string>
#include <vector>

#include <diffusion_gemma/cpu/engine.hpp>
#include <diffusion_gemma/io/chat_format.hpp>
#include <diffusion_gemma/io/tokenizer.hpp>
#include <diffusion_gemma/runtime/decoder.hpp>

namespace dg = diffusion_gemma;

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: getting_started MODEL_DIR \"question\"\n");
    return 2;
  }
  const std::string dir = argv[1];
  try {
    // 1. Load the checkpoint (config.json, generation_config.json, safetensors) and its tokenizer.
    auto model = dg::cpu::Model::load(dir);
    const auto tokenizer = dg::io::Tokenizer::from_file(dir + "/tokenizer.json");

    // 2. The prompt in the Gemma 4 chat format, as token ids.
    const std::vector<int> ids = dg::io::encode_chat(tokenizer, {{"user", argv[2]}});
    const std::vector<std::int32_t> prompt(ids.begin(), ids.end());

    // 3. A decoder: the CPU engine over the DiffusionGemma backbone, the reference sampler.
    dg::Decoder<dg::cpu::Engine<dg::DiffusionGemmaBackbone>> decoder(model);
    auto options = decoder.default_options(model->generation_config());
    options.sampler.rng.seed = 1;

    // 4. Generate; committed canvases stream through the callback.
    dg::Callbacks callbacks;
    callbacks.on_commit = [&](const dg::CommitEvent& e) {
      std::printf("[canvas %d: %d steps]\n", e.record.canvas, e.record.steps);
      return true;
    };
    const dg::GenerationResult result = decoder.generate(prompt, options, callbacks);

    // 5. Text up to the first stop id.
    const std::vector<std::int32_t> out = result.text_tokens();
    std::printf("%s\n", tokenizer.decode(std::vector<int>(out.begin(), out.end())).c_str());
    std::printf("%.2f tokens per forward\n", result.tokens_per_forward);
  } catch (const dg::Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  return 0;
}
