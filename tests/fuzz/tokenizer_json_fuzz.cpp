// SPDX-License-Identifier: Apache-2.0
// libFuzzer target: tokenizer.json loading from arbitrary bytes, then an encode/decode round of a
// fixed text with whatever loaded. Must end in a working tokenizer or a diffusion_gemma::Error.
#include <cstddef>
#include <cstdint>
#include <string>

#include <diffusion_gemma/io/tokenizer.hpp>

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  try {
    const auto j = diffusion_gemma::io::parse_json_text(text, "fuzz");
    const auto tok = diffusion_gemma::io::Tokenizer::from_json(j, "tokenizer.json");
    const auto ids = tok.encode("Hello \xe2\x96\x81 world <eos> \xff caf\xc3\xa9");
    (void)tok.decode(ids, false);
    (void)tok.decode(ids, true);
  } catch (const diffusion_gemma::Error&) {
  }
  return 0;
}
