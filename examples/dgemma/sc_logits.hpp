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
// out); NaN, +inf or a row with no finite logit is refused, naming it: each would spread through
// the bidirectional canvas into every output logit, and parity would write NaN with exit code 0.
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
  for (std::size_t r = 0; r < static_cast<std::size_t>(C); ++r) {
    bool finite = false;
    for (std::size_t i = r * row; i < (r + 1) * row; ++i) {
      if (std::isnan(out[i]) || out[i] == std::numeric_limits<float>::infinity()) {
        throw dg::Error(dg::StatusCode::kFormatError, path + ": tensor 'sc_logits'[" + std::to_string(r) + ", " +
                                                          std::to_string(i - r * row) + "] is " +
                                                          (std::isnan(out[i]) ? "NaN" : "+inf"));
      }
      finite = finite || std::isfinite(out[i]);
    }
    // A row of -inf rules out every token: its softmax is 0/0.
    if (!finite && V > 0) {
      throw dg::Error(dg::StatusCode::kFormatError,
                      path + ": tensor 'sc_logits' row " + std::to_string(r) + " is -inf everywhere (no token left)");
    }
  }
  return out;
}

}  // namespace dgemma
