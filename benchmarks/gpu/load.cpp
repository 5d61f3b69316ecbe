// SPDX-License-Identifier: Apache-2.0
#include "load.hpp"

#include <diffusion_gemma/io/load.hpp>

namespace dg_bench {

HostCheckpoint load_checkpoint(const std::string& dir) {
  diffusion_gemma::io::LoadedCheckpoint c = diffusion_gemma::io::load_checkpoint(dir);
  HostCheckpoint h;
  h.config = c.config;
  h.generation = c.generation;
  h.weights = c.weights;
  h.holder = c.checkpoint;
  return h;
}

}  // namespace dg_bench
