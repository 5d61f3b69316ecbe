// SPDX-License-Identifier: Apache-2.0
// Host launcher of the per-head norm + RoPE kernel (kernel/rope.cuh). No workspace.
#pragma once

#include <cstdint>

#include <cuda_runtime_api.h>

#include <diffusion_gemma/core/status.hpp>
#include <diffusion_gemma/cuda/kernel/rope.cuh>
#include <diffusion_gemma/cuda/runtime.hpp>

namespace diffusion_gemma::cuda {

inline std::size_t qkv_norm_rope_workspace_bytes() { return 0; }

template <class Act>
Status launch_qkv_norm_rope(const QkvNormRopeParams<Act>& p, cudaStream_t stream) {
  if (p.tokens == 0) return {};
  if (p.head_dim <= 0 || p.head_dim % 2 != 0) {
    return make_status(StatusCode::kInvalidArgument, "qkv_norm_rope: head_dim ", p.head_dim,
                       " must be positive and even");
  }
  if (p.inv_freq == nullptr) return make_status(StatusCode::kInvalidArgument, "qkv_norm_rope: no inv_freq table");
  const std::int64_t warps = static_cast<std::int64_t>(p.tokens) * (p.num_heads + 2 * p.num_kv_heads);
  constexpr int kWarpsPerBlock = kQkvThreads / kWarpSize;
  const std::int64_t blocks = (warps + kWarpsPerBlock - 1) / kWarpsPerBlock;
  qkv_norm_rope_kernel<Act><<<static_cast<unsigned>(blocks), kQkvThreads, 0, stream>>>(p);
  DG_CUDA_TRY_LAUNCH("qkv_norm_rope_kernel");
  return {};
}

}  // namespace diffusion_gemma::cuda
