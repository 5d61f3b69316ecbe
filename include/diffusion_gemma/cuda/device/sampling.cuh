// SPDX-License-Identifier: Apache-2.0
// The random draws of a denoising step on the device, as the CPU back-end defines them
// (cpu/vocab_pass.hpp, sampler/rng.hpp): Philox4x32-10 keyed by (seed, canvas, step, position,
// purpose, index) from core/rng.hpp, so both back-ends draw identical numbers.
//
// Candidate sampling works per chunk of kSampleChunk vocabulary ids: a chunk is chosen by
// Gumbel-max over the chunk log-masses (word 1 of the chunk's draw), an id inside it by inverse
// CDF (word 0). Chunk scores merge like an argmax: highest score, lowest chunk on ties.
#pragma once

#include <climits>
#include <cmath>
#include <cstdint>

#include <diffusion_gemma/core/macros.hpp>
#include <diffusion_gemma/core/math.hpp>
#include <diffusion_gemma/core/rng.hpp>
#include <diffusion_gemma/cuda/device/reduce.cuh>
#include <diffusion_gemma/sampler/vocab_stats.hpp>

namespace diffusion_gemma::cuda {

inline constexpr int kChunk = static_cast<int>(kSampleChunk);

struct SampleCandidate {
  float score = -INFINITY;
  int chunk = INT_MAX;  // global chunk index; INT_MAX: none
  float u = 0.0f;       // the in-chunk uniform (word 0)
  float mass = 0.0f;    // sum of e^(l - m) over the chunk, m the running max the score used
};

DG_DEVICE SampleCandidate candidate_merge(const SampleCandidate& a, const SampleCandidate& b) {
  return (b.score > a.score || (b.score == a.score && b.chunk < a.chunk)) ? b : a;
}

// The candidate of one chunk: `running_max` is the row maximum that `mass` is relative to. The
// score is m + log(mass) + Gumbel, in that order, as the CPU pass computes it.
DG_DEVICE SampleCandidate chunk_candidate(const DrawKey& key, std::uint32_t position, int chunk, float running_max,
                                          float mass) {
  const Philox4x32 d = draw(key, DrawPurpose::kSample, position, static_cast<std::uint32_t>(chunk));
  SampleCandidate c;
  c.score = running_max + logf(mass) + math::gumbel(uniform_open01(d.v[1]));
  c.chunk = chunk;
  c.u = uniform_open01(d.v[0]);
  c.mass = mass;
  return c;
}

DG_DEVICE SampleCandidate warp_candidate(SampleCandidate c) {
  for (int o = kWarpSize / 2; o > 0; o >>= 1) {
    SampleCandidate b;
    b.score = __shfl_down_sync(kFullMask, c.score, o);
    b.chunk = __shfl_down_sync(kFullMask, c.chunk, o);
    b.u = __shfl_down_sync(kFullMask, c.u, o);
    b.mass = __shfl_down_sync(kFullMask, c.mass, o);
    c = candidate_merge(c, b);
  }
  return c;  // valid in lane 0
}

// Inverse CDF inside the chosen chunk, exactly the CPU loop (one thread, sequential fp32 sums, so
// that both back-ends pick the same id): the first id whose running sum exceeds `target`, or the
// last id with mass when rounding leaves the sum short of it.
DG_DEVICE int inverse_cdf_pick(const float* e, int n, float target) {
  float cum = 0.0f;
  int pick = -1;
  for (int i = 0; i < n; ++i) {
    if (e[i] > 0.0f) pick = i;
    cum += e[i];
    if (cum > target) {
      pick = i;
      break;
    }
  }
  return pick;
}

// A uniform token for a re-noised position: PhiloxRng::token(kRenoise, canvas, step, position).
DG_DEVICE std::int32_t renoise_token(const DrawKey& key, std::uint32_t position, std::uint32_t vocab) {
  const Philox4x32 d = draw(key, DrawPurpose::kRenoise, position, 0);
  return static_cast<std::int32_t>(uniform_below(d.v[0], vocab));
}

}  // namespace diffusion_gemma::cuda
