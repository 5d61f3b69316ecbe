// SPDX-License-Identifier: Apache-2.0
// Must NOT compile: an engine without denoise_step given to Decoder. tests/design/expect_compile_error.cmake
// checks that the compiler's message names the missing member (runtime/engine_traits.hpp).
#include <cstdint>

#include <diffusion_gemma/runtime/decoder.hpp>

namespace dg = diffusion_gemma;

struct IncompleteEngine {
  struct Cache {};
  const dg::ModelConfig& config() const { return cfg; }
  Cache make_cache(std::int64_t) const { return {}; }
  std::size_t request_bytes(std::int64_t, std::int64_t, std::int64_t) const { return 0; }
  void encode(const std::int32_t*, std::int64_t, Cache&) {}
  dg::ModelConfig cfg;
};

int main() {
  dg::Decoder<IncompleteEngine> decoder;
  (void)decoder;
}
