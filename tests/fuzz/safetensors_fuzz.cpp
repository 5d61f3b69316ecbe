// SPDX-License-Identifier: Apache-2.0
// libFuzzer target: the safetensors parser on arbitrary bytes. Every input must either parse into
// views that lie inside the buffer or raise diffusion_gemma::Error; anything else (a crash, an
// out-of-bounds read caught by ASan, another exception type) is a bug.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <vector>

#include <diffusion_gemma/io/safetensors.hpp>

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  // A private copy, so ASan flags any read past the end of the input.
  std::vector<std::byte> buf(size);
  if (size) std::memcpy(buf.data(), data, size);
  try {
    const auto entries = diffusion_gemma::io::detail::parse_safetensors(buf.data(), size, "fuzz", nullptr);
    for (const auto& e : entries) {
      const auto* b = e.tensor.data;
      if (e.tensor.nbytes && (b < buf.data() || b + e.tensor.nbytes > buf.data() + size)) std::abort();
      volatile std::uint8_t sink = 0;
      for (std::size_t i = 0; i < e.tensor.nbytes; ++i) sink ^= static_cast<std::uint8_t>(b[i]);
      (void)sink;
    }
  } catch (const diffusion_gemma::Error&) {
  }
  return 0;
}
