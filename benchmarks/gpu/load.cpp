// SPDX-License-Identifier: Apache-2.0
#include "load.hpp"

#include <diffusion_gemma/io/config.hpp>
#include <diffusion_gemma/io/safetensors.hpp>
#include <diffusion_gemma/io/weights.hpp>

namespace dg_bench {

HostCheckpoint load_checkpoint(const std::string& dir) {
  namespace io = diffusion_gemma::io;
  HostCheckpoint h;
  h.config = io::load_model_config(dir);
  h.generation = io::load_generation_config(dir);
  auto ckpt = std::make_shared<io::Checkpoint>(dir);
  h.weights = io::bind_weights(*ckpt, h.config);
  h.holder = ckpt;
  return h;
}

}  // namespace dg_bench
