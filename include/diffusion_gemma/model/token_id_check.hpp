// SPDX-License-Identifier: Apache-2.0
// The token-id check of passes whose ids live on the device (the host cannot look at them without
// a copy and a wait). The embedding gather tests each id; an out-of-vocabulary one gets a zero row
// and is recorded in one 64-bit error word, which the engine reads at its next synchronisation.
// The word keeps the first bad position: position in the high 32 bits, the id's bits in the low
// 32, so that the minimum over all records (atomicMin on the device) is the lowest position.
#pragma once

#include <cstdint>

#include <diffusion_gemma/core/macros.hpp>
#include <diffusion_gemma/core/status.hpp>

namespace diffusion_gemma {

using BadTokenWord = unsigned long long;  // the type of CUDA's 64-bit atomicMin
static_assert(sizeof(BadTokenWord) == 8, "the bad-token word packs two 32-bit fields");

inline constexpr BadTokenWord kNoBadToken = ~BadTokenWord{0};  // positions stay below 2^31

DG_HOST_DEVICE bool token_id_in_vocabulary(std::int32_t id, std::int64_t vocab_size) {
  return id >= 0 && id < vocab_size;
}

// The record of token `id` at `position` (0 <= position < 2^31) of a pass.
DG_HOST_DEVICE BadTokenWord bad_token_record(std::int64_t position, std::int32_t id) {
  return (static_cast<BadTokenWord>(static_cast<std::uint32_t>(position)) << 32) |
         static_cast<BadTokenWord>(static_cast<std::uint32_t>(id));
}

// Two records merged: the one at the lower position (what atomicMin leaves in the word).
DG_HOST_DEVICE BadTokenWord first_bad_token(BadTokenWord a, BadTokenWord b) { return a < b ? a : b; }

DG_HOST_DEVICE std::int64_t bad_token_position(BadTokenWord w) { return static_cast<std::int64_t>(w >> 32); }
DG_HOST_DEVICE std::int32_t bad_token_id(BadTokenWord w) {
  return static_cast<std::int32_t>(static_cast<std::uint32_t>(w & 0xffffffffull));
}

// kOutOfRange naming the first bad id, or OK when `w` holds none. `what` names the pass.
inline Status bad_token_status(BadTokenWord w, std::int64_t vocab_size, const char* what) {
  if (w == kNoBadToken) return {};
  return make_status(StatusCode::kOutOfRange, what, ": token id ", bad_token_id(w), " at position ",
                     bad_token_position(w), " is outside the vocabulary [0, ", vocab_size,
                     ") (its embedding was read as zeros; the results of that pass are invalid)");
}

}  // namespace diffusion_gemma
