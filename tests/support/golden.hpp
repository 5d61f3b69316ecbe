// SPDX-License-Identifier: Apache-2.0
// Reading the transformers-produced golden tensors and comparing float arrays.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include <diffusion_gemma/io/safetensors.hpp>

namespace dg_test {

inline std::vector<float> floats(const diffusion_gemma::io::SafetensorsFile& f, const std::string& name) {
  const auto& t = f.at(name);
  std::vector<float> out(static_cast<std::size_t>(t.shape.numel()));
  for (std::size_t i = 0; i < out.size(); ++i) out[i] = diffusion_gemma::load_as_float(t, static_cast<std::int64_t>(i));
  return out;
}

inline std::vector<std::int32_t> ids(const diffusion_gemma::io::SafetensorsFile& f, const std::string& name) {
  const auto& t = f.at(name);
  std::vector<std::int32_t> out(static_cast<std::size_t>(t.shape.numel()));
  for (std::size_t i = 0; i < out.size(); ++i) {
    std::int64_t x;
    std::memcpy(&x, t.data + i * 8, 8);
    out[i] = static_cast<std::int32_t>(x);
  }
  return out;
}

inline double max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
  if (a.size() != b.size()) return INFINITY;
  double m = 0.0;
  for (std::size_t i = 0; i < a.size(); ++i) m = std::max(m, static_cast<double>(std::abs(a[i] - b[i])));
  return m;
}

}  // namespace dg_test
