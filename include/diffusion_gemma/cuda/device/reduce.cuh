// SPDX-License-Identifier: Apache-2.0
// Warp and block reductions (CUB-style building blocks, caller-placed shared memory): sums, max,
// argmax with the lowest index winning ties (torch.argmax's rule), and the online softmax
// statistics of core/math.hpp merged across lanes and warps.
//
// Uniformity: xor-butterfly sums leave the same value in every lane (IEEE addition is
// commutative, so both members of each pair compute the same sum). Merges that are not
// commutative under FMA contraction (SoftmaxStats) reduce to lane 0 and broadcast instead.
#pragma once

#include <climits>
#include <cmath>

#include <diffusion_gemma/core/macros.hpp>
#include <diffusion_gemma/core/math.hpp>

namespace diffusion_gemma::cuda {

inline constexpr int kWarpSize = 32;
inline constexpr unsigned kFullMask = 0xffffffffu;

// Shared-memory storage for N objects of a type with default member initialisers: nvcc refuses
// __shared__ variables whose constructor is not trivial, so the bytes are declared and cast.
//   __shared__ SharedArray<ArgMax, 9> scratch;  block_argmax<256>(a, scratch.get());
template <class T, int N>
struct SharedArray {
  alignas(T) unsigned char bytes[sizeof(T) * N];
  DG_DEVICE T* get() { return reinterpret_cast<T*>(bytes); }
};

template <class T>
DG_DEVICE T warp_sum(T v) {
  for (int o = kWarpSize / 2; o > 0; o >>= 1) v += __shfl_xor_sync(kFullMask, v, o);
  return v;
}

DG_DEVICE float warp_max(float v) {
  for (int o = kWarpSize / 2; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(kFullMask, v, o));
  return v;
}

// Block-wide sum; every thread gets the result. `smem` holds kThreads / 32 + 1 values.
template <int kThreads, class T>
DG_DEVICE T block_sum(T v, T* smem) {
  static_assert(kThreads % kWarpSize == 0 && kThreads <= 1024, "block_sum: kThreads is a multiple of 32, <= 1024");
  constexpr int kWarps = kThreads / kWarpSize;
  const int warp = static_cast<int>(threadIdx.x) / kWarpSize, lane = static_cast<int>(threadIdx.x) % kWarpSize;
  v = warp_sum(v);
  if (lane == 0) smem[warp] = v;
  __syncthreads();
  if (warp == 0) {
    T w = lane < kWarps ? smem[lane] : T(0);
    w = warp_sum(w);
    if (lane == 0) smem[kWarps] = w;
  }
  __syncthreads();
  const T r = smem[kWarps];
  __syncthreads();  // the caller may reuse smem at once
  return r;
}

template <int kThreads>
DG_DEVICE float block_max(float v, float* smem) {
  constexpr int kWarps = kThreads / kWarpSize;
  const int warp = static_cast<int>(threadIdx.x) / kWarpSize, lane = static_cast<int>(threadIdx.x) % kWarpSize;
  v = warp_max(v);
  if (lane == 0) smem[warp] = v;
  __syncthreads();
  if (warp == 0) {
    float w = lane < kWarps ? smem[lane] : -INFINITY;
    w = warp_max(w);
    if (lane == 0) smem[kWarps] = w;
  }
  __syncthreads();
  const float r = smem[kWarps];
  __syncthreads();
  return r;
}

// ---- argmax: largest value, lowest index on ties -------------------------------------------------

struct ArgMax {
  float value = -INFINITY;
  int index = INT_MAX;  // INT_MAX: nothing seen yet
};

// Feed values through this: NaN becomes -inf so that the merge stays a total, commutative order.
DG_DEVICE float argmax_key(float x) { return x != x ? -INFINITY : x; }

DG_DEVICE ArgMax argmax_merge(ArgMax a, ArgMax b) {
  return (b.value > a.value || (b.value == a.value && b.index < a.index)) ? b : a;
}

DG_DEVICE ArgMax warp_argmax(ArgMax a) {
  for (int o = kWarpSize / 2; o > 0; o >>= 1) {
    ArgMax b;
    b.value = __shfl_xor_sync(kFullMask, a.value, o);
    b.index = __shfl_xor_sync(kFullMask, a.index, o);
    a = argmax_merge(a, b);
  }
  return a;
}

// `smem` holds kThreads / 32 + 1 entries.
template <int kThreads>
DG_DEVICE ArgMax block_argmax(ArgMax a, ArgMax* smem) {
  constexpr int kWarps = kThreads / kWarpSize;
  const int warp = static_cast<int>(threadIdx.x) / kWarpSize, lane = static_cast<int>(threadIdx.x) % kWarpSize;
  a = warp_argmax(a);
  if (lane == 0) smem[warp] = a;
  __syncthreads();
  if (warp == 0) {
    ArgMax w = lane < kWarps ? smem[lane] : ArgMax{};
    w = warp_argmax(w);
    if (lane == 0) smem[kWarps] = w;
  }
  __syncthreads();
  const ArgMax r = smem[kWarps];
  __syncthreads();
  return r;
}

// ---- online softmax statistics (math::SoftmaxStats) ----------------------------------------------

DG_DEVICE math::SoftmaxStats shfl_down_stats(const math::SoftmaxStats& s, int offset) {
  math::SoftmaxStats o;
  o.max = __shfl_down_sync(kFullMask, s.max, offset);
  o.sum = __shfl_down_sync(kFullMask, s.sum, offset);
  o.weighted = __shfl_down_sync(kFullMask, s.weighted, offset);
  return o;
}

// Merged statistics of the warp, valid in every lane (reduced to lane 0, then broadcast).
DG_DEVICE math::SoftmaxStats warp_merge_stats(math::SoftmaxStats s) {
  for (int o = kWarpSize / 2; o > 0; o >>= 1) {
    const math::SoftmaxStats other = shfl_down_stats(s, o);
    s.merge(other);
  }
  math::SoftmaxStats r;
  r.max = __shfl_sync(kFullMask, s.max, 0);
  r.sum = __shfl_sync(kFullMask, s.sum, 0);
  r.weighted = __shfl_sync(kFullMask, s.weighted, 0);
  return r;
}

// `smem` holds kThreads / 32 + 1 entries; every thread gets the merged statistics.
template <int kThreads>
DG_DEVICE math::SoftmaxStats block_merge_stats(math::SoftmaxStats s, math::SoftmaxStats* smem) {
  constexpr int kWarps = kThreads / kWarpSize;
  const int warp = static_cast<int>(threadIdx.x) / kWarpSize, lane = static_cast<int>(threadIdx.x) % kWarpSize;
  s = warp_merge_stats(s);
  if (lane == 0) smem[warp] = s;
  __syncthreads();
  if (warp == 0) {
    math::SoftmaxStats w = lane < kWarps ? smem[lane] : math::SoftmaxStats{};
    w = warp_merge_stats(w);
    if (lane == 0) smem[kWarps] = w;
  }
  __syncthreads();
  const math::SoftmaxStats r = smem[kWarps];
  __syncthreads();
  return r;
}

}  // namespace diffusion_gemma::cuda
