// SPDX-License-Identifier: Apache-2.0
// The row work of the streaming vocabulary pass (docs/sampler.md §5, cpu/vocab_pass.hpp). The
// launcher walks the vocabulary in tiles; per tile, a GEMM gives raw logits [C, tile] and
// vocab_tile_kernel (one block per canvas row) applies softcap and temperature, updates the row's
// argmax, online max / sum / weighted sum (math::SoftmaxStats) and chunked Gumbel sample,
// rescales the row's soft-embedding accumulator to the new max and leaves e^(l - m) for the
// second GEMM (soft += P E_tile). Nothing of size [C, V] ever exists.
//
// The row state lives in global memory between tiles, owned by thread 0 of the row's block; the
// per-row operations that decide a token (argmax ties, chunk choice, inverse CDF) follow the CPU
// pass operation by operation so that both back-ends agree on every decision up to rounding of
// the logits themselves.
#pragma once

#include <climits>
#include <cmath>
#include <cstdint>

#include <diffusion_gemma/core/macros.hpp>
#include <diffusion_gemma/core/math.hpp>
#include <diffusion_gemma/core/rng.hpp>
#include <diffusion_gemma/cuda/device/convert.cuh>
#include <diffusion_gemma/cuda/device/reduce.cuh>
#include <diffusion_gemma/cuda/device/sampling.cuh>

namespace diffusion_gemma::cuda {

inline constexpr int kVocabThreads = 256;
inline constexpr int kVocabWarps = kVocabThreads / kWarpSize;

struct VocabRowState {
  math::SoftmaxStats stats;  // of l = softcap(raw) / T over the tiles seen so far
  float best;                // largest l so far; argmax is its first index
  std::int32_t argmax;
  float sample_score;  // best chunk score so far; sample is the id drawn inside that chunk
  std::int32_t sample;
};

template <class Act>
struct VocabTileParams {
  float* logits = nullptr;  // [rows, ld] fp32: raw logits on entry, e^(l - m) on exit
  std::int64_t ld = 0;
  Act* probs = nullptr;  // [rows, ld]: e^(l - m) in the storage type for the SC GEMM; null when no SC
                         // or when Act is float (the GEMM then reads `logits` itself)
  VocabRowState* rows = nullptr;
  float* soft = nullptr;  // [rows, hidden] soft-embedding accumulator, or null
  int hidden = 0;
  std::int64_t v0 = 0;  // first id of the tile; a multiple of kSampleChunk
  int n = 0;            // ids in the tile
  float cap = 0.0f, temperature = 1.0f;
  bool sample = true;
  DrawKey key;
};

template <int kUnused = 0>
__global__ void vocab_init_kernel(VocabRowState* rows, int count) {
  const int r = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
  if (r >= count) return;
  VocabRowState s;
  s.stats = math::SoftmaxStats{};
  s.best = -INFINITY;
  s.argmax = 0;
  s.sample_score = -INFINITY;
  s.sample = 0;
  rows[r] = s;
}

template <class Act>
__global__ void __launch_bounds__(kVocabThreads) vocab_tile_kernel(VocabTileParams<Act> p) {
  __shared__ SharedArray<ArgMax, kVocabWarps + 1> argmax_scratch;
  __shared__ float sum_scratch[kVocabWarps + 1];
  __shared__ SharedArray<SampleCandidate, kVocabWarps> candidates;
  __shared__ float chunk_e[kChunk];
  __shared__ float row_max, row_alpha;
  __shared__ int winning_chunk;  // local chunk index whose id must be drawn, or -1

  const int r = static_cast<int>(blockIdx.x);
  const int tid = static_cast<int>(threadIdx.x), warp = tid / kWarpSize, lane = tid % kWarpSize;
  float* L = p.logits + static_cast<std::int64_t>(r) * p.ld;

  // 1. softcap and temperature in place (fp32 divide, the reference's order); the tile's argmax.
  ArgMax best;
  for (int i = tid; i < p.n; i += kVocabThreads) {
    const float x = math::softcap(L[i], p.cap) / p.temperature;
    L[i] = x;
    best = argmax_merge(best, ArgMax{argmax_key(x), i});
  }
  best = block_argmax<kVocabThreads>(best, argmax_scratch.get());
  if (tid == 0) {
    VocabRowState& st = p.rows[r];
    const float old_max = st.stats.max;
    const float m = best.value > old_max ? best.value : old_max;
    if (best.value > st.best) {  // strict: an earlier tile keeps a tie, like torch.argmax
      st.best = best.value;
      st.argmax = static_cast<std::int32_t>(p.v0 + best.index);
    }
    row_max = m;
    row_alpha = (old_max != m && old_max != -INFINITY) ? expf(old_max - m) : 1.0f;
  }
  __syncthreads();
  const float m = row_max;

  // 2. e = exp(l - m) and its statistics; warps take whole sampling chunks so that each chunk's
  //    mass is one warp reduction.
  float sum = 0.0f, weighted = 0.0f;
  SampleCandidate cand;
  const int chunks = (p.n + kChunk - 1) / kChunk;
  for (int c = warp; c < chunks; c += kVocabWarps) {
    float mass = 0.0f;
    for (int k = 0; k < kChunk / kWarpSize; ++k) {
      const int i = c * kChunk + k * kWarpSize + lane;
      if (i >= p.n) break;
      const float d = L[i] - m;
      const float e = math::exp_approx(d);  // the CPU pass's exponential, element for element
      sum += e;
      if (e > 0.0f) weighted += e * d;  // as math::softmax_stats_block: -inf logits add nothing
      mass += e;
      L[i] = e;
      if (p.probs != nullptr) p.probs[static_cast<std::int64_t>(r) * p.ld + i] = from_float<Act>(e);
    }
    mass = warp_sum(mass);
    if (p.sample && lane == 0 && mass > 0.0f) {
      const int chunk = static_cast<int>(p.v0 / kChunk) + c;
      cand = candidate_merge(cand, chunk_candidate(p.key, static_cast<std::uint32_t>(r), chunk, m, mass));
    }
  }
  sum = block_sum<kVocabThreads>(sum, sum_scratch);
  weighted = block_sum<kVocabThreads>(weighted, sum_scratch);
  if (lane == 0) candidates.get()[warp] = cand;
  __syncthreads();
  SampleCandidate win;
  if (tid == 0) {
    VocabRowState& st = p.rows[r];
    math::SoftmaxStats block;
    block.max = m;
    block.sum = sum;
    block.weighted = weighted;
    st.stats.merge(block);
    for (int w = 0; w < kVocabWarps; ++w) win = candidate_merge(win, candidates.get()[w]);
    winning_chunk = -1;
    if (p.sample && win.chunk != INT_MAX && win.score > st.sample_score) {
      st.sample_score = win.score;
      winning_chunk = win.chunk - static_cast<int>(p.v0 / kChunk);
    }
  }
  __syncthreads();

  // 3. The winning chunk's id by inverse CDF, sequentially in one thread, as the CPU does.
  if (winning_chunk >= 0) {
    const int c0 = winning_chunk * kChunk;
    const int cn = p.n - c0 < kChunk ? p.n - c0 : kChunk;
    for (int i = tid; i < cn; i += kVocabThreads) chunk_e[i] = L[c0 + i];
    __syncthreads();
    if (tid == 0) {
      const int pick = inverse_cdf_pick(chunk_e, cn, win.u * win.mass);
      p.rows[r].sample = static_cast<std::int32_t>(p.v0 + c0 + pick);
    }
  }

  // 4. Rescale the soft-embedding accumulator to the new max before this tile's GEMM adds to it.
  const float alpha = row_alpha;
  if (p.soft != nullptr && alpha != 1.0f) {
    float* s = p.soft + static_cast<std::int64_t>(r) * p.hidden;
    for (int i = tid; i < p.hidden; i += kVocabThreads) s[i] *= alpha;
  }
}

// Per row: argmax, sample (-1 when not sampled), entropy, and soft = acc * (embed_scale / S).
template <int kUnused = 0>
__global__ void __launch_bounds__(kVocabThreads)
    vocab_finish_kernel(const VocabRowState* rows, bool sampled, float embed_scale, int hidden, std::int32_t* argmax,
                        std::int32_t* sample, float* entropy, float* soft) {
  const int r = static_cast<int>(blockIdx.x);
  const VocabRowState st = rows[r];
  if (threadIdx.x == 0) {
    argmax[r] = st.argmax;
    sample[r] = sampled ? st.sample : -1;
    // No finite logit in the row (NaN activations): NaN, as the CPU pass reports, not a confident 0.
    entropy[r] = st.stats.max > -INFINITY ? st.stats.entropy() : NAN;
  }
  if (soft != nullptr) {
    const float scale = embed_scale / st.stats.sum;
    float* s = soft + static_cast<std::int64_t>(r) * hidden;
    for (int i = static_cast<int>(threadIdx.x); i < hidden; i += kVocabThreads) s[i] *= scale;
  }
}

}  // namespace diffusion_gemma::cuda
