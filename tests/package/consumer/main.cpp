// SPDX-License-Identifier: Apache-2.0
// Parses a checkpoint's config.json through the installed/fetched headers and prints a summary.
#include <cstdio>

#include <diffusion_gemma/core/bfloat16.hpp>
#include <diffusion_gemma/io/config.hpp>
#include <diffusion_gemma/version.hpp>

int main(int argc, char** argv) {
  if (argc != 2) return 2;
  const auto cfg = diffusion_gemma::io::load_model_config(argv[1]);
  std::printf("diffusion_gemma %s: %d layers, hidden %d, embed scale %.1f\n", diffusion_gemma::kVersionString,
              cfg.num_layers(), cfg.hidden_size,
              diffusion_gemma::round_to_bfloat16(static_cast<float>(__builtin_sqrt(2816.0))));
  return cfg.num_layers() > 0 ? 0 : 1;
}
