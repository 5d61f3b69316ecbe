// SPDX-License-Identifier: Apache-2.0
// A copy of a fixture checkpoint with some tensors replaced, dropped or added: for tests of what
// the library does with a checkpoint that is broken in one known way.
#pragma once

#include <algorithm>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include <diffusion_gemma/io/config.hpp>
#include <diffusion_gemma/io/safetensors.hpp>
#include <diffusion_gemma/io/safetensors_writer.hpp>
#include <diffusion_gemma/io/weights.hpp>

#include "support/paths.hpp"

namespace dg_test {

// Copies the dg_small fixture into a fresh directory, editing its tensors on the way.
struct EditedCheckpoint {
  std::string dir;
  EditedCheckpoint(const std::string& name, const std::map<std::string, std::vector<float>>& replace,
                   const std::vector<std::string>& drop, const std::map<std::string, diffusion_gemma::Shape>& add) {
    dir = dg_test::temp_dir(name);
    const std::string src = dg_test::fixture("dg_small");
    for (const char* f : {"config.json", "generation_config.json"}) {
      std::ifstream in(src + "/" + f, std::ios::binary);
      std::ofstream out(dir + "/" + f, std::ios::binary);
      out << in.rdbuf();
    }
    const diffusion_gemma::io::SafetensorsFile ckpt(src + "/model.safetensors");
    diffusion_gemma::io::SafetensorsWriter w;
    for (const auto& e : ckpt.entries()) {
      if (std::find(drop.begin(), drop.end(), e.name) != drop.end()) continue;
      const auto it = replace.find(e.name);
      if (it != replace.end()) {
        w.add(e.name, diffusion_gemma::Shape{static_cast<std::int64_t>(it->second.size())}, it->second.data());
      } else {
        w.add(e.name, e.tensor.dtype, e.tensor.shape, e.tensor.data);
      }
    }
    for (const auto& kv : add) {
      std::vector<float> zeros(static_cast<std::size_t>(kv.second.numel()), 0.0f);
      w.add(kv.first, kv.second, zeros.data());
    }
    w.write(dir + "/model.safetensors");
  }
  std::string bind_error() const {
    try {
      const diffusion_gemma::io::Checkpoint c(dir);
      diffusion_gemma::io::bind_weights(c, diffusion_gemma::io::load_model_config(dir));
    } catch (const diffusion_gemma::Error& e) {
      return e.what();
    }
    return "";
  }
};

}  // namespace dg_test
