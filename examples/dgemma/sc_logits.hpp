// SPDX-License-Identifier: Apache-2.0
// `dgemma parity --sc-logits FILE`: the previous step's logits a denoising pass is conditioned on.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include <diffusion_gemma/core/status.hpp>
#include <diffusion_gemma/io/safetensors.hpp>

namespace dgemma {

// Reads the F32 tensor `sc_logits` [C, V] of a safetensors file. -inf is a logit (a token ruled
// out); NaN or +inf is refused, naming the element: either would spread through the bidirectional
// canvas into every output logit, and parity would write a file of NaN with exit code 0.
inline std::vector<float> read_sc_logits(const std::string& path, std::int64_t C, std::int64_t V) {
  namespace dg = diffusion_gemma;
  const dg::io::SafetensorsFile f(path);
  const auto& t = f.at("sc_logits");
  if (t.dtype != dg::DType::kF32 || t.shape != dg::Shape{C, V}) {
    throw dg::Error(dg::StatusCode::kFormatError, path + ": tensor 'sc_logits' must be F32 " + dg::Shape{C, V}.str() +
                                                      ", is " + dg::dtype_name(t.dtype) + " " + t.shape.str());
  }
  std::vector<float> out(static_cast<std::size_t>(C * V));
  std::memcpy(out.data(), t.data, out.size() * sizeof(float));
  const std::size_t row = static_cast<std::size_t>(V);
  for (std::size_t i = 0; i < out.size(); ++i) {
    if (std::isnan(out[i]) || out[i] == std::numeric_limits<float>::infinity()) {
      throw dg::Error(dg::StatusCode::kFormatError, path + ": tensor 'sc_logits'[" + std::to_string(i / row) + ", " +
                                                        std::to_string(i % row) + "] is " +
                                                        (std::isnan(out[i]) ? "NaN" : "+inf"));
    }
  }
  return out;
}

}  // namespace dgemma
