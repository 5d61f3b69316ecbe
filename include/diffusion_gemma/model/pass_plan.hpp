// SPDX-License-Identifier: Apache-2.0
// How an engine splits its work into passes, and how many workspace rows the passes of a request
// need. The encoder runs a prompt in chunks of EngineOptions::max_pass_tokens (exact: it is
// causal); the denoiser runs a whole canvas in one pass. Shared by both back-ends so that their
// chunking and their request_bytes() agree.
#pragma once

#include <algorithm>
#include <cstdint>

#include <diffusion_gemma/core/status.hpp>

namespace diffusion_gemma {

// `option` names the engine option in the message.
inline void check_max_pass_tokens(std::int64_t max_pass_tokens, const char* option) {
  if (max_pass_tokens <= 0) {
    throw_error(StatusCode::kInvalidArgument, option, " ", max_pass_tokens, " must be positive");
  }
}

// Tokens of the encoder pass that starts after `done` of `n` tokens: `chunk`, or what is left.
inline std::int64_t encoder_pass_tokens(std::int64_t n, std::int64_t done, std::int64_t chunk) {
  return std::min(chunk, n - done);
}

// Encoder passes over `n` tokens in chunks of `chunk`.
inline std::int64_t encoder_pass_count(std::int64_t n, std::int64_t chunk) { return n <= 0 ? 0 : (n + chunk - 1) / chunk; }

// Rows of the largest pass a request runs: an encoder chunk of its prompt, or its longest canvas.
// The prompt length itself never sizes the workspace (only the KV cache grows with it).
inline std::int64_t request_pass_rows(std::int64_t prompt_tokens, std::int64_t canvas_tokens, std::int64_t chunk) {
  return std::max(std::min(prompt_tokens, chunk), canvas_tokens);
}

}  // namespace diffusion_gemma
