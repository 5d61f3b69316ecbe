// SPDX-License-Identifier: Apache-2.0
// Row-wise and element-wise kernels of a layer: embedding gather, RMSNorm (with optional weight,
// fused residual add and scale), GELU-tanh gating, adds, conversions, softcap, the materialised
// softmax of the reference SC path, and fills for synthetic weights. Arithmetic is fp32 and every
// formula comes from core/math.hpp; outputs that feed a GEMM are written in the storage type.
#pragma once

#include <cmath>
#include <cstdint>

#include <diffusion_gemma/core/macros.hpp>
#include <diffusion_gemma/core/math.hpp>
#include <diffusion_gemma/core/rng.hpp>
#include <diffusion_gemma/model/token_id_check.hpp>
#include <diffusion_gemma/cuda/device/convert.cuh>
#include <diffusion_gemma/cuda/device/reduce.cuh>

namespace diffusion_gemma::cuda {

inline constexpr int kRowThreads = 256;  // one block per row for the row kernels

// out[t, :] = table[ids[t], :] * scale (the embedding times sqrt(hidden) in the weights' dtype).
// Ids come from device memory that the host has not seen: an id outside [0, vocab) reads no
// memory, gets a zero row and is recorded in `bad_token` (model/token_id_check.hpp), if given.
template <class W>
__global__ void __launch_bounds__(kRowThreads) embed_kernel(const std::int32_t* ids, const W* table, int hidden,
                                                            float scale, std::int64_t vocab, BadTokenWord* bad_token,
                                                            float* out) {
  const std::int64_t t = blockIdx.x;
  const std::int32_t id = ids[t];
  if (!token_id_in_vocabulary(id, vocab)) {
    for (int i = static_cast<int>(threadIdx.x); i < hidden; i += kRowThreads) out[t * hidden + i] = 0.0f;
    if (threadIdx.x == 0 && bad_token != nullptr) atomicMin(bad_token, bad_token_record(t, id));
    return;
  }
  const W* row = table + static_cast<std::int64_t>(id) * hidden;
  for (int i = static_cast<int>(threadIdx.x); i < hidden; i += kRowThreads) {
    out[t * hidden + i] = as_float(row[i]) * scale;
  }
}

// RMSNorm of rows with the engine's fusions:
//   y = (in[r] * inv) * weight          (weight may be null: weightless norm)
//   out[r] = residual ? (residual[r] + y) * scale : y * scale
// which covers x += norm(a) (scale 1), x = (x + norm(s)) * layer_scalar, s = d + norm(s), and the
// router's rms(r) * router.scale * hidden^-0.5. `out` may alias `in` or `residual` (each thread
// reads the elements it writes). Sums of squares are reduced in double, as math::rms_norm_row.
struct RmsNormParams {
  const float* in = nullptr;  // [rows, n]
  const float* weight = nullptr;
  const float* residual = nullptr;
  float scale = 1.0f;
  float eps = 1e-6f;
  int n = 0;
  std::int64_t rows = 0;
};

template <class Out>
__global__ void __launch_bounds__(kRowThreads) rms_norm_kernel(RmsNormParams p, Out* out) {
  __shared__ double partial[kRowThreads / kWarpSize + 1];
  const std::int64_t r = blockIdx.x;
  const float* x = p.in + r * p.n;
  double ss = 0.0;
  for (int i = static_cast<int>(threadIdx.x); i < p.n; i += kRowThreads) {
    ss += static_cast<double>(x[i]) * x[i];
  }
  ss = block_sum<kRowThreads>(ss, partial);
  const float inv = math::rms_inverse(ss, p.n, p.eps);
  const float* res = p.residual != nullptr ? p.residual + r * p.n : nullptr;
  Out* o = out + r * p.n;
  for (int i = static_cast<int>(threadIdx.x); i < p.n; i += kRowThreads) {
    float y = x[i] * inv;
    if (p.weight != nullptr) y = y * p.weight[i];
    y = res != nullptr ? (res[i] + y) * p.scale : y * p.scale;
    o[i] = from_float<Out>(y);
  }
}

// out[r, i] = gelu_tanh(in[r, i]) * in[r, width + i]: the [gate | up] halves of a fused GEMM.
template <class Out>
__global__ void gelu_gate_kernel(const float* in, std::int64_t rows, int width, Out* out) {
  const std::int64_t total = rows * width;
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const std::int64_t r = i / width, c = i - r * width;
    const float* row = in + r * 2 * width;
    out[i] = from_float<Out>(math::gelu_tanh(row[c]) * row[width + c]);
  }
}

// x[i] += y[i] (the self-conditioning MLP output onto the embedding). Kernels are templates so
// that a header-only library defines them once per program (nvcc ignores `inline` on __global__).
template <class T>
__global__ void add_kernel(T* x, const T* y, std::int64_t n) {
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    x[i] += y[i];
  }
}

template <class Out>
__global__ void convert_kernel(const float* in, std::int64_t n, Out* out) {
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    out[i] = from_float<Out>(in[i]);
  }
}

template <class T>
__global__ void softcap_kernel(T* x, std::int64_t n, float cap) {
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    x[i] = math::softcap(x[i], cap);
  }
}

// probs[r] = softmax(logits[r]) over V ids, in the CPU reference path's order: max, e = exp(l - m)
// summed in double, then e * float(1 / sum). Output in the storage type (transformers rounds the
// probabilities to bf16 before the SC matmul).
template <class Out>
__global__ void __launch_bounds__(kRowThreads)
    softmax_rows_kernel(const float* logits, std::int64_t vocab, Out* probs) {
  __shared__ float max_scratch[kRowThreads / kWarpSize + 1];
  __shared__ double sum_scratch[kRowThreads / kWarpSize + 1];
  const std::int64_t r = blockIdx.x;
  const float* l = logits + r * vocab;
  float m = -INFINITY;
  for (std::int64_t i = threadIdx.x; i < vocab; i += kRowThreads) m = fmaxf(m, l[i]);
  m = block_max<kRowThreads>(m, max_scratch);
  double s = 0.0;
  for (std::int64_t i = threadIdx.x; i < vocab; i += kRowThreads) s += static_cast<double>(expf(l[i] - m));
  s = block_sum<kRowThreads>(s, sum_scratch);
  const float inv = static_cast<float>(1.0 / s);
  for (std::int64_t i = threadIdx.x; i < vocab; i += kRowThreads) {
    probs[r * vocab + i] = from_float<Out>(expf(l[i] - m) * inv);
  }
}

// Synthetic parameters: p[i] = offset + scale * (2u - 1), u uniform in (0, 1) from Philox keyed by
// (seed, tensor id, element), so a benchmark model is the same on every run and device.
template <class T>
__global__ void fill_uniform_kernel(T* p, std::int64_t n, std::uint64_t seed, std::uint32_t tensor_id, float scale,
                                    float offset) {
  const DrawKey key{seed, tensor_id, 0};
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const Philox4x32 d = draw(key, DrawPurpose::kUser, static_cast<std::uint32_t>(i),
                              static_cast<std::uint32_t>(static_cast<std::uint64_t>(i) >> 32));
    p[i] = from_float<T>(offset + scale * (2.0f * uniform_open01(d.v[0]) - 1.0f));
  }
}

}  // namespace diffusion_gemma::cuda
