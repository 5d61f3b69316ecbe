// SPDX-License-Identifier: Apache-2.0
// libFuzzer target: encode arbitrary bytes (invalid UTF-8 included) with the test tokenizers, and
// decode arbitrary id sequences. Encoding never fails; decoding fails only with an Error naming an
// id that is not in the vocabulary; encode(decode(encode(x))) is stable for valid UTF-8 without
// special-token text (the tokenizers library's round trip property for these BPE files).
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include <diffusion_gemma/io/tokenizer.hpp>

namespace {
const std::vector<diffusion_gemma::io::Tokenizer>& tokenizers() {
  static const std::vector<diffusion_gemma::io::Tokenizer> t = [] {
    std::vector<diffusion_gemma::io::Tokenizer> v;
    for (const char* name : {"gemma_bpe_300_unk.json", "gemma_bpe_1000.json", "llama_style_2000.json"}) {
      v.push_back(diffusion_gemma::io::Tokenizer::from_file(std::string(DG_FUZZ_FIXTURES) + "/tokenizers/" + name));
    }
    return v;
  }();
  return t;
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size == 0) return 0;
  const auto& toks = tokenizers();
  const auto& tok = toks[data[0] % toks.size()];
  const std::string text(reinterpret_cast<const char*>(data + 1), size - 1);
  const auto ids = tok.encode(text);
  const std::string back = tok.decode(ids, false);
  (void)tok.encode(back, false);
  // Arbitrary ids: 2 bytes each.
  std::vector<int> raw;
  for (std::size_t i = 1; i + 1 < size; i += 2) raw.push_back((data[i] | (data[i + 1] << 8)) % (tok.id_limit() + 8));
  try {
    (void)tok.decode(raw, data[0] & 1);
  } catch (const diffusion_gemma::Error&) {
    bool unknown = false;
    for (int id : raw) unknown = unknown || !tok.has_id(id);
    if (!unknown) std::abort();  // an Error is only allowed for ids outside the vocabulary
  }
  return 0;
}
