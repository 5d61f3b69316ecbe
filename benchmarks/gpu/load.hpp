// SPDX-License-Identifier: Apache-2.0
// Checkpoint loading for the GPU benchmark, kept out of nvcc: io/ (nlohmann) is compiled by the
// host compiler in load.cpp.
#pragma once

#include <memory>
#include <string>

#include <diffusion_gemma/model/config.hpp>
#include <diffusion_gemma/model/weights.hpp>

namespace dg_bench {

struct HostCheckpoint {
  diffusion_gemma::ModelConfig config;
  diffusion_gemma::GenerationConfig generation;
  diffusion_gemma::ModelWeights weights;  // views, valid while `holder` lives
  std::shared_ptr<const void> holder;
};

HostCheckpoint load_checkpoint(const std::string& dir);

}  // namespace dg_bench
