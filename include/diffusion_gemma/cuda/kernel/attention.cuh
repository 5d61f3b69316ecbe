// SPDX-License-Identifier: Apache-2.0
// Self-attention of one layer over [visible cached prefix | the pass's new tokens], both modes:
// which key a query sees is the Attention policy's DG_HOST_DEVICE visible() (model/attention.hpp),
// the same rule the CPU back-end applies, so the encoder's causal sliding window and the
// denoiser's bidirectional canvas with transformers' fixed-prefix sliding window are one kernel.
//
// Flash-attention style, fp32 arithmetic, scale 1.0 (Gemma 4 has no 1/sqrt(d)): a block owns
// kRows query rows of one KV head (rows are (token, head) pairs of the GQA group, so K/V tiles are
// read once per group) and walks the keys in tiles of kKeys with an online max / rescale. Each
// warp owns two rows: lane j scores key j of the tile, then every lane accumulates its slice of
// the head dimension from P V. Shared rows are padded to D + 1 floats: D is even, so the stride
// is odd and the 32 lanes reading 32 different key rows hit 32 different banks.
//
// kHeadDim = 256 or 512 are the compiled fast paths (Gemma 4's sliding and full layers); 0 is the
// generic path for any even head_dim <= 512 (the test fixtures use 10..32).
#pragma once

#include <cmath>
#include <cstdint>

#include <diffusion_gemma/core/macros.hpp>
#include <diffusion_gemma/cuda/device/convert.cuh>
#include <diffusion_gemma/cuda/device/reduce.cuh>
#include <diffusion_gemma/model/attention.hpp>
#include <diffusion_gemma/model/config.hpp>

namespace diffusion_gemma::cuda {

inline constexpr int kAttentionThreads = 256;
inline constexpr int kAttentionRows = 2 * (kAttentionThreads / kWarpSize);  // two query rows per warp
inline constexpr int kAttentionKeys = kWarpSize;                            // one key per lane
inline constexpr int kAttentionMaxHeadDim = 512;

template <class Act>
struct AttentionParams {
  const Act* q = nullptr;      // [tokens, Hq, D]
  const Act* k_new = nullptr;  // [tokens, Hkv, D]: this pass's keys, normed and roped
  const Act* v_new = nullptr;
  const Act* k_cache = nullptr;  // [Hkv, capacity, D] of this layer; unused when no cached key is read
  const Act* v_cache = nullptr;
  Act* out = nullptr;  // [tokens, Hq, D]
  std::int64_t cache_capacity = 0;
  std::int64_t cached_begin = 0;  // first cached position read; cached keys are [cached_begin, pass_begin)
  std::int64_t pass_begin = 0;    // position of new token 0 (the cache length before the pass)
  int sequence = 0;               // the sequence's index in a batched call (attention_visible)
  int tokens = 0, num_heads = 0, num_kv_heads = 0, head_dim = 0;
  int window = 0;  // sliding_window
  AttentionMode mode = AttentionMode::kEncoder;
  LayerType type = LayerType::kFull;
};

// Dynamic shared memory of one block: the Q rows and one K or V tile, fp32, rows padded by one.
inline std::size_t attention_smem_bytes(int head_dim) {
  return static_cast<std::size_t>(kAttentionRows + kAttentionKeys) * (head_dim + 1) * sizeof(float);
}

namespace detail {

// Loads keys (or values) k0 .. k0 + kKeys - 1 of the concatenated [cached | new] sequence.
template <class Act>
DG_DEVICE void load_kv_tile(const AttentionParams<Act>& p, const Act* cached, const Act* fresh, std::int64_t k0,
                            std::int64_t num_cached, std::int64_t num_keys, int g, int D, float* tile) {
  const int stride = D + 1;
  for (int idx = static_cast<int>(threadIdx.x); idx < kAttentionKeys * D; idx += kAttentionThreads) {
    const int j = idx / D, d = idx - j * D;
    const std::int64_t key = k0 + j;
    float v = 0.0f;
    if (key < num_cached) {
      v = as_float(cached[(g * p.cache_capacity + p.cached_begin + key) * D + d]);
    } else if (key < num_keys) {
      v = as_float(fresh[((key - num_cached) * p.num_kv_heads + g) * D + d]);
    }
    tile[j * stride + d] = v;
  }
}

// Online softmax step of one row held by a warp: `s` is this lane's score (-inf when masked).
// Returns this lane's probability relative to the new running max; rescales the accumulator.
template <int kSlices>
DG_DEVICE float online_softmax_step(float s, float& m, float& l, float (&acc)[kSlices]) {
  const float m_new = fmaxf(m, warp_max(s));
  if (m_new == -INFINITY) return 0.0f;  // nothing visible yet: exp(-inf - -inf) would be NaN
  const float prob = expf(s - m_new);   // 0 for masked keys
  const float alpha = expf(m - m_new);  // 0 while m is still -inf
  l = l * alpha + warp_sum(prob);
#pragma unroll
  for (int i = 0; i < kSlices; ++i) acc[i] *= alpha;
  m = m_new;
  return prob;
}

}  // namespace detail

// Grid: (ceil(tokens * group / kRows), Hkv); block kAttentionThreads; attention_smem_bytes(D).
template <class Attention, class Act, int kHeadDim>
__global__ void __launch_bounds__(kAttentionThreads) attention_kernel(AttentionParams<Act> p) {
  static_assert(kHeadDim == 0 || (kHeadDim % kWarpSize == 0 && kHeadDim <= kAttentionMaxHeadDim),
                "attention_kernel: kHeadDim is 0 (generic) or a multiple of 32 up to 512");
  constexpr int kMaxD = kHeadDim > 0 ? kHeadDim : kAttentionMaxHeadDim;
  constexpr int kSlices = kMaxD / kWarpSize;  // head-dim elements per lane in the P V accumulator
  const int D = kHeadDim > 0 ? kHeadDim : p.head_dim;
  const int stride = D + 1;
  extern __shared__ float smem[];
  float* q_tile = smem;                                // [kRows][stride]
  float* kv_tile = smem + kAttentionRows * stride;     // [kKeys][stride]

  const int group = p.num_heads / p.num_kv_heads;
  const int g = static_cast<int>(blockIdx.y);
  const std::int64_t rows = static_cast<std::int64_t>(p.tokens) * group;
  const std::int64_t row0 = static_cast<std::int64_t>(blockIdx.x) * kAttentionRows;
  const int warp = static_cast<int>(threadIdx.x) / kWarpSize, lane = static_cast<int>(threadIdx.x) % kWarpSize;

  for (int idx = static_cast<int>(threadIdx.x); idx < kAttentionRows * D; idx += kAttentionThreads) {
    const int r = idx / D, d = idx - r * D;
    const std::int64_t row = row0 + r;
    float v = 0.0f;
    if (row < rows) {
      const std::int64_t t = row / group;
      const int h = g * group + static_cast<int>(row % group);
      v = as_float(p.q[(t * p.num_heads + h) * D + d]);
    }
    q_tile[r * stride + d] = v;
  }

  // This warp's two rows: (token, head) pairs row0 + 2 warp and row0 + 2 warp + 1.
  const int ra = 2 * warp, rb = 2 * warp + 1;
  const bool valid_a = row0 + ra < rows, valid_b = row0 + rb < rows;
  const std::int64_t qpos_a = p.pass_begin + (valid_a ? (row0 + ra) / group : 0);
  const std::int64_t qpos_b = p.pass_begin + (valid_b ? (row0 + rb) / group : 0);
  float m_a = -INFINITY, l_a = 0.0f, m_b = -INFINITY, l_b = 0.0f;
  float acc_a[kSlices], acc_b[kSlices];
#pragma unroll
  for (int i = 0; i < kSlices; ++i) acc_a[i] = acc_b[i] = 0.0f;

  const std::int64_t num_cached = p.pass_begin - p.cached_begin;
  const std::int64_t num_keys = num_cached + p.tokens;
  for (std::int64_t k0 = 0; k0 < num_keys; k0 += kAttentionKeys) {
    const std::int64_t key = k0 + lane;
    const std::int64_t kpos = key < num_cached ? p.cached_begin + key : p.pass_begin + (key - num_cached);
    const bool in_range = key < num_keys;
    const bool vis_a = valid_a && in_range && attention_visible<Attention>(p.mode, p.type, p.window, qpos_a, kpos, p.pass_begin, p.sequence);
    const bool vis_b = valid_b && in_range && attention_visible<Attention>(p.mode, p.type, p.window, qpos_b, kpos, p.pass_begin, p.sequence);
    // A tile no row of the block can see is skipped whole (causal future, outside a window).
    // The barrier also orders the previous tile's P V reads before this tile's loads.
    if (!__syncthreads_or(vis_a || vis_b)) continue;

    detail::load_kv_tile(p, p.k_cache, p.k_new, k0, num_cached, num_keys, g, D, kv_tile);
    __syncthreads();
    float s_a = 0.0f, s_b = 0.0f;
    {
      const float* krow = kv_tile + lane * stride;
      const float* qa = q_tile + ra * stride;
      const float* qb = q_tile + rb * stride;
#pragma unroll 8
      for (int d = 0; d < D; ++d) {
        const float kd = krow[d];
        s_a += qa[d] * kd;
        s_b += qb[d] * kd;
      }
    }
    const float p_a = detail::online_softmax_step(vis_a ? s_a : -INFINITY, m_a, l_a, acc_a);
    const float p_b = detail::online_softmax_step(vis_b ? s_b : -INFINITY, m_b, l_b, acc_b);
    __syncthreads();  // every warp is done with the keys
    detail::load_kv_tile(p, p.v_cache, p.v_new, k0, num_cached, num_keys, g, D, kv_tile);
    __syncthreads();
    for (int j = 0; j < kAttentionKeys; ++j) {
      const float pj_a = __shfl_sync(kFullMask, p_a, j), pj_b = __shfl_sync(kFullMask, p_b, j);
      const float* vrow = kv_tile + j * stride;
#pragma unroll
      for (int i = 0; i < kSlices; ++i) {
        const int d = lane + kWarpSize * i;
        if (kHeadDim > 0 || d < D) {
          const float vd = vrow[d];
          acc_a[i] += pj_a * vd;
          acc_b[i] += pj_b * vd;
        }
      }
    }
  }

  const auto store = [&](bool valid, int r, float l, const float (&acc)[kSlices]) {
    if (!valid) return;
    const std::int64_t row = row0 + r;
    const std::int64_t t = row / group;
    const int h = g * group + static_cast<int>(row % group);
    Act* o = p.out + (t * p.num_heads + h) * D;
    const float inv = l > 0.0f ? 1.0f / l : 0.0f;  // a row that saw no key (impossible for Gemma 4) gives 0
#pragma unroll
    for (int i = 0; i < kSlices; ++i) {
      const int d = lane + kWarpSize * i;
      if (kHeadDim > 0 || d < D) o[d] = from_float<Act>(acc[i] * inv);
    }
  };
  store(valid_a, ra, l_a, acc_a);
  store(valid_b, rb, l_b, acc_b);
}

}  // namespace diffusion_gemma::cuda
