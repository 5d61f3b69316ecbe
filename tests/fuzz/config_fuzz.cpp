// SPDX-License-Identifier: Apache-2.0
// libFuzzer target: config.json and generation_config.json parsing on arbitrary bytes. Must end in
// a valid config (validate() passed) or a diffusion_gemma::Error.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include <diffusion_gemma/io/config.hpp>

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  try {
    const auto j = diffusion_gemma::io::parse_json_text(text, "fuzz");
    try {
      const auto c = diffusion_gemma::io::parse_model_config(j, "config.json");
      c.validate();
      if (c.num_layers() <= 0) std::abort();
    } catch (const diffusion_gemma::Error&) {
    }
    try {
      diffusion_gemma::io::parse_generation_config(j, "generation_config.json").validate();
    } catch (const diffusion_gemma::Error&) {
    }
  } catch (const diffusion_gemma::Error&) {
  }
  return 0;
}
