// SPDX-License-Identifier: Apache-2.0
// Reads a draws file (safetensors, I64 tensors) recorded from transformers' generate:
// prompt_ids [P], canvas.{b}.init [C], canvas.{b}.step.{s}.sample [C], canvas.{b}.step.{s}.renoise [C].
#pragma once

#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include <diffusion_gemma/core/status.hpp>
#include <diffusion_gemma/io/safetensors.hpp>
#include <diffusion_gemma/sampler/rng.hpp>

namespace diffusion_gemma::io {

inline std::vector<std::int32_t> read_token_ids(const SafetensorsFile& f, const SafetensorsEntry& e) {
  const RawTensor& t = e.tensor;
  if (t.shape.rank != 1) {
    throw_error(StatusCode::kFormatError, f.path(), ": tensor '", e.name, "' must be 1-D, has shape ", t.shape.str());
  }
  std::vector<std::int32_t> out(static_cast<std::size_t>(t.shape[0]));
  for (std::size_t i = 0; i < out.size(); ++i) {
    std::int64_t v = 0;
    if (t.dtype == DType::kI64) {
      std::memcpy(&v, t.data + i * 8, 8);
    } else if (t.dtype == DType::kI32) {
      std::int32_t w;
      std::memcpy(&w, t.data + i * 4, 4);
      v = w;
    } else {
      throw_error(StatusCode::kFormatError, f.path(), ": tensor '", e.name, "' must be I64 or I32, is ", dtype_name(t.dtype));
    }
    if (v < 0 || v > INT32_MAX) throw_error(StatusCode::kFormatError, f.path(), ": '", e.name, "'[", i, "] = ", v, " is not a token id");
    out[i] = static_cast<std::int32_t>(v);
  }
  return out;
}

// canvas.{b}.init or canvas.{b}.step.{s}.sample / .renoise, b and s decimal numbers.
inline bool is_draws_tensor_name(const std::string& name) {
  std::size_t at = 0;
  const auto literal = [&](const char* text) {
    const std::size_t n = std::strlen(text);
    if (name.compare(at, n, text) != 0) return false;
    at += n;
    return true;
  };
  const auto number = [&] {
    const std::size_t start = at;
    while (at < name.size() && at - start < 9 && name[at] >= '0' && name[at] <= '9') ++at;
    return at > start && (at - start == 1 || name[start] != '0');
  };
  if (!literal("canvas.") || !number()) return false;
  if (literal(".init")) return at == name.size();
  if (!literal(".step.") || !number()) return false;
  return (literal(".sample") || literal(".renoise")) && at == name.size();
}

struct DrawsFile {
  std::vector<std::int32_t> prompt_ids;
  std::shared_ptr<RecordedDraws> draws;
};

inline DrawsFile load_draws(const std::string& path) {
  SafetensorsFile f(path);
  DrawsFile out;
  out.draws = std::make_shared<RecordedDraws>();
  out.draws->source = path;
  for (const auto& e : f.entries()) {
    if (e.name == "prompt_ids") {
      out.prompt_ids = read_token_ids(f, e);
    } else if (is_draws_tensor_name(e.name)) {
      out.draws->tensors[e.name] = read_token_ids(f, e);
    } else {
      throw_error(StatusCode::kFormatError, path, ": unexpected tensor '", e.name,
                  "' (a draws file holds prompt_ids and canvas.{b}.init / .step.{s}.sample / .step.{s}.renoise)");
    }
  }
  return out;
}

}  // namespace diffusion_gemma::io
