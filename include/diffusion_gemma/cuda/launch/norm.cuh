// SPDX-License-Identifier: Apache-2.0
// Host launchers of the row and element-wise kernels (kernel/norm.cuh). They enqueue on the
// caller's stream, never allocate and never synchronise; none needs a workspace.
#pragma once

#include <algorithm>
#include <cstdint>

#include <cuda_runtime_api.h>

#include <diffusion_gemma/core/status.hpp>
#include <diffusion_gemma/cuda/kernel/norm.cuh>
#include <diffusion_gemma/cuda/runtime.hpp>

namespace diffusion_gemma::cuda {

namespace detail {

inline constexpr int kElementThreads = 256;

// Blocks for a grid-stride loop over n elements: enough to fill the GPU, bounded.
inline unsigned elementwise_blocks(std::int64_t n) {
  const std::int64_t blocks = (n + kElementThreads - 1) / kElementThreads;
  return static_cast<unsigned>(std::min<std::int64_t>(std::max<std::int64_t>(blocks, 1), 8192));
}

inline Status check_rows(std::int64_t rows, const char* what) {
  if (rows < 0 || rows > 0x7fffffff) return make_status(StatusCode::kOutOfRange, what, ": ", rows, " rows");
  return {};
}

}  // namespace detail

inline std::size_t norm_workspace_bytes() { return 0; }

// out[t] = table[ids[t]] * scale for `tokens` device ids of a `vocab`-row table. An id outside
// [0, vocab) gets a zero row and is recorded in the device word `bad_token` (null: not recorded),
// which keeps the first bad position; the engine reads it when it next synchronises.
template <class W>
Status launch_embed(const std::int32_t* ids, std::int64_t tokens, const W* table, int hidden, float scale,
                    std::int64_t vocab, BadTokenWord* bad_token, float* out, cudaStream_t stream) {
  if (tokens == 0) return {};
  Status s = detail::check_rows(tokens, "embed");
  if (!s.ok()) return s;
  embed_kernel<W><<<static_cast<unsigned>(tokens), kRowThreads, 0, stream>>>(ids, table, hidden, scale, vocab,
                                                                             bad_token, out);
  DG_CUDA_TRY_LAUNCH("embed_kernel");
  return {};
}

template <class Out>
Status launch_rms_norm(const RmsNormParams& p, Out* out, cudaStream_t stream) {
  if (p.rows == 0) return {};
  Status s = detail::check_rows(p.rows, "rms_norm");
  if (!s.ok()) return s;
  if (p.n <= 0) return make_status(StatusCode::kInvalidArgument, "rms_norm: row width ", p.n);
  rms_norm_kernel<Out><<<static_cast<unsigned>(p.rows), kRowThreads, 0, stream>>>(p, out);
  DG_CUDA_TRY_LAUNCH("rms_norm_kernel");
  return {};
}

template <class Out>
Status launch_gelu_gate(const float* in, std::int64_t rows, int width, Out* out, cudaStream_t stream) {
  const std::int64_t n = rows * width;
  if (n == 0) return {};
  gelu_gate_kernel<Out><<<detail::elementwise_blocks(n), detail::kElementThreads, 0, stream>>>(in, rows, width, out);
  DG_CUDA_TRY_LAUNCH("gelu_gate_kernel");
  return {};
}

inline Status launch_add(float* x, const float* y, std::int64_t n, cudaStream_t stream) {
  if (n == 0) return {};
  add_kernel<float><<<detail::elementwise_blocks(n), detail::kElementThreads, 0, stream>>>(x, y, n);
  DG_CUDA_TRY_LAUNCH("add_kernel");
  return {};
}

template <class Out>
Status launch_convert(const float* in, std::int64_t n, Out* out, cudaStream_t stream) {
  if (n == 0) return {};
  convert_kernel<Out><<<detail::elementwise_blocks(n), detail::kElementThreads, 0, stream>>>(in, n, out);
  DG_CUDA_TRY_LAUNCH("convert_kernel");
  return {};
}

inline Status launch_softcap(float* x, std::int64_t n, float cap, cudaStream_t stream) {
  if (n == 0 || !(cap > 0.0f)) return {};
  softcap_kernel<float><<<detail::elementwise_blocks(n), detail::kElementThreads, 0, stream>>>(x, n, cap);
  DG_CUDA_TRY_LAUNCH("softcap_kernel");
  return {};
}

template <class Out>
Status launch_softmax_rows(const float* logits, std::int64_t rows, std::int64_t vocab, Out* probs,
                           cudaStream_t stream) {
  if (rows == 0) return {};
  Status s = detail::check_rows(rows, "softmax_rows");
  if (!s.ok()) return s;
  softmax_rows_kernel<Out><<<static_cast<unsigned>(rows), kRowThreads, 0, stream>>>(logits, vocab, probs);
  DG_CUDA_TRY_LAUNCH("softmax_rows_kernel");
  return {};
}

template <class T>
Status launch_fill_uniform(T* p, std::int64_t n, std::uint64_t seed, std::uint32_t tensor_id, float scale,
                           float offset, cudaStream_t stream) {
  if (n == 0) return {};
  fill_uniform_kernel<T><<<detail::elementwise_blocks(n), detail::kElementThreads, 0, stream>>>(p, n, seed, tensor_id,
                                                                                               scale, offset);
  DG_CUDA_TRY_LAUNCH("fill_uniform_kernel");
  return {};
}

}  // namespace diffusion_gemma::cuda
