// SPDX-License-Identifier: Apache-2.0
// Per-head norms and rotary embedding after the fused QKV projection (docs/model.md §3.1-3.3): q
// and k get RMSNorm with their weight and rotate-half RoPE (pair i with i + D/2, angle
// math::rope_angle of the inv_freq table the host built with model/rope_table.hpp, the CPU
// back-end's very bits); v gets a weightless RMSNorm and no RoPE, and on k_eq_v layers it is taken
// from the raw k projection. Encoder passes also append k and v to the KV cache here.
#pragma once

#include <cmath>
#include <cstdint>

#include <diffusion_gemma/core/macros.hpp>
#include <diffusion_gemma/core/math.hpp>
#include <diffusion_gemma/cuda/device/convert.cuh>
#include <diffusion_gemma/cuda/device/reduce.cuh>

namespace diffusion_gemma::cuda {

inline constexpr int kQkvThreads = 256;  // 8 warps, one (token, head) row each

template <class Act>
struct QkvNormRopeParams {
  const float* qkv = nullptr;  // [tokens, ld]: Hq q heads, Hkv k heads, then Hkv v heads when has_v
  std::int64_t ld = 0;
  int tokens = 0, num_heads = 0, num_kv_heads = 0, head_dim = 0;
  bool has_v = true;
  const float* q_norm = nullptr;  // [head_dim]
  const float* k_norm = nullptr;
  float eps = 1e-6f;
  std::int64_t first_position = 0;  // position of token 0
  const float* inv_freq = nullptr;  // [head_dim / 2] of this layer (RopeTables), in device memory
  Act* q = nullptr;  // [tokens, Hq, D]
  Act* k = nullptr;  // [tokens, Hkv, D]
  Act* v = nullptr;
  Act* cache_k = nullptr;  // [Hkv, capacity, D] of this layer, or null (denoiser passes never write)
  Act* cache_v = nullptr;
  std::int64_t cache_capacity = 0;
};

template <class Act>
__global__ void __launch_bounds__(kQkvThreads) qkv_norm_rope_kernel(QkvNormRopeParams<Act> p) {
  const int lane = static_cast<int>(threadIdx.x) % kWarpSize;
  const int slots = p.num_heads + 2 * p.num_kv_heads;
  const std::int64_t w = static_cast<std::int64_t>(blockIdx.x) * (kQkvThreads / kWarpSize) + threadIdx.x / kWarpSize;
  if (w >= static_cast<std::int64_t>(p.tokens) * slots) return;  // the whole warp leaves together
  const int t = static_cast<int>(w / slots), slot = static_cast<int>(w % slots);
  const int D = p.head_dim, half = D / 2, Hq = p.num_heads, Hkv = p.num_kv_heads;
  const bool is_q = slot < Hq, is_k = !is_q && slot < Hq + Hkv, is_v = !is_q && !is_k;
  // v of k_eq_v layers is the raw k projection: slot Hq + Hkv + g reads k head g.
  const int source = is_v && !p.has_v ? slot - Hkv : slot;
  const float* x = p.qkv + t * p.ld + static_cast<std::int64_t>(source) * D;

  double ss = 0.0;
  for (int i = lane; i < D; i += kWarpSize) ss += static_cast<double>(x[i]) * x[i];
  ss = warp_sum(ss);
  const float inv = math::rms_inverse(ss, D, p.eps);
  const float* weight = is_q ? p.q_norm : is_k ? p.k_norm : nullptr;

  Act* dst = nullptr;
  Act* cache = nullptr;
  if (is_q) {
    dst = p.q + (static_cast<std::int64_t>(t) * Hq + slot) * D;
  } else {
    const int g = is_k ? slot - Hq : slot - Hq - Hkv;
    dst = (is_k ? p.k : p.v) + (static_cast<std::int64_t>(t) * Hkv + g) * D;
    Act* base = is_k ? p.cache_k : p.cache_v;
    if (base != nullptr) cache = base + (g * p.cache_capacity + p.first_position + t) * D;
  }
  for (int i = lane; i < half; i += kWarpSize) {
    float lo = x[i] * inv, hi = x[i + half] * inv;  // (x * inv) * w, as math::rms_norm_row
    if (weight != nullptr) {
      lo = lo * weight[i];
      hi = hi * weight[i + half];
    }
    if (!is_v) {
      const float angle = math::rope_angle(p.first_position + t, p.inv_freq[i]);
      math::rope_rotate_pair(lo, hi, cosf(angle), sinf(angle));
    }
    const Act a = from_float<Act>(lo), b = from_float<Act>(hi);
    dst[i] = a;
    dst[i + half] = b;
    if (cache != nullptr) {
      cache[i] = a;
      cache[i + half] = b;
    }
  }
}

}  // namespace diffusion_gemma::cuda
