// SPDX-License-Identifier: Apache-2.0
// Checks every back-end applies to a pass's inputs before touching any buffer.
#pragma once

#include <cstdint>

#include <diffusion_gemma/core/status.hpp>
#include <diffusion_gemma/model/config.hpp>

namespace diffusion_gemma {

// `what` names the input in the message ("canvas", "encoder input").
inline void check_token_ids(const ModelConfig& cfg, const std::int32_t* ids, std::int64_t n, const char* what) {
  if (n <= 0) throw_error(StatusCode::kInvalidArgument, what, " is empty");
  for (std::int64_t i = 0; i < n; ++i) {
    if (ids[i] < 0 || ids[i] >= cfg.vocab_size) {
      throw_error(StatusCode::kInvalidArgument, what, ": token id ", ids[i], " at position ", i,
                  " is outside the vocabulary [0, ", cfg.vocab_size, ")");
    }
  }
}

// A pass may use positions below `end` only.
inline void check_positions(const ModelConfig& cfg, std::int64_t end) {
  if (end > cfg.max_position_embeddings) {
    throw_error(StatusCode::kOutOfRange, "positions up to ", end - 1, " exceed max_position_embeddings ",
                cfg.max_position_embeddings, " of ", cfg.source);
  }
}

}  // namespace diffusion_gemma
