// SPDX-License-Identifier: Apache-2.0
// libFuzzer target: config.json's quantization_config (compressed-tensors and GPTQ) on arbitrary
// bytes, and matching module names against whatever targets and ignore patterns it declares.
// Must end in a parsed config or a diffusion_gemma::Error.
#include <cstddef>
#include <cstdint>
#include <string>

#include <diffusion_gemma/io/quantization_config.hpp>

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  try {
    const auto j = diffusion_gemma::io::parse_json_text(text, "fuzz");
    const auto c = diffusion_gemma::io::parse_quantization_config(j, "config.json");
    (void)c.describe();
    for (const char* name : {"model.decoder.layers.0.self_attn.q_proj", "model.decoder.layers.12.experts.101.down_proj",
                             "model.encoder.language_model.layers.3.router.proj", "lm_head"}) {
      (void)c.group_of(name, "Linear");
    }
  } catch (const diffusion_gemma::Error&) {
  }
  return 0;
}
