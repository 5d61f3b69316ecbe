// SPDX-License-Identifier: Apache-2.0
// Host launcher of the attention kernel (kernel/attention.cuh): picks the head-dim fast path
// (256, 512) or the generic one, sets the dynamic shared-memory size. No workspace.
#pragma once

#include <cstdint>
#include <type_traits>

#include <cuda_runtime_api.h>

#include <diffusion_gemma/core/status.hpp>
#include <diffusion_gemma/cuda/kernel/attention.cuh>
#include <diffusion_gemma/cuda/runtime.hpp>
#include <diffusion_gemma/model/attention.hpp>

namespace diffusion_gemma::cuda {

inline std::size_t attention_workspace_bytes() { return 0; }

// The one choke point from a runtime head_dim to the compiled variants: f(integral_constant<int,
// 256 | 512 | 0>) where 0 is the generic kernel.
template <class F>
decltype(auto) dispatch_head_dim(int head_dim, F&& f) {
  switch (head_dim) {
    case 256: return f(std::integral_constant<int, 256>{});
    case 512: return f(std::integral_constant<int, 512>{});
    default: return f(std::integral_constant<int, 0>{});
  }
}

template <class Attention, class Act>
Status can_launch_attention(const AttentionParams<Act>& p) {
  static_assert(is_attention_policy<Attention>::value,
                "launch_attention<Attention, Act>: Attention must be an attention policy (model/attention.hpp)");
  if (p.head_dim <= 0 || p.head_dim % 2 != 0 || p.head_dim > kAttentionMaxHeadDim) {
    return make_status(StatusCode::kUnsupported, "attention: head_dim ", p.head_dim, " must be even and at most ",
                       kAttentionMaxHeadDim);
  }
  if (p.num_kv_heads <= 0 || p.num_heads % p.num_kv_heads != 0) {
    return make_status(StatusCode::kInvalidArgument, "attention: ", p.num_heads, " query heads are not a multiple of ",
                       p.num_kv_heads, " KV heads");
  }
  if (p.cached_begin > p.pass_begin || p.cached_begin < 0) {
    return make_status(StatusCode::kInvalidArgument, "attention: cached range [", p.cached_begin, ", ", p.pass_begin,
                       ") is inverted");
  }
  return {};
}

template <class Attention, class Act>
Status launch_attention(const AttentionParams<Act>& p, cudaStream_t stream) {
  Status s = can_launch_attention<Attention>(p);
  if (!s.ok() || p.tokens == 0) return s;
  const std::int64_t rows = static_cast<std::int64_t>(p.tokens) * (p.num_heads / p.num_kv_heads);
  const dim3 grid(static_cast<unsigned>((rows + kAttentionRows - 1) / kAttentionRows),
                  static_cast<unsigned>(p.num_kv_heads));
  const std::size_t smem = attention_smem_bytes(p.head_dim);
  return dispatch_head_dim(p.head_dim, [&](auto dim) -> Status {
    constexpr int kHeadDim = decltype(dim)::value;
    const auto kernel = attention_kernel<Attention, Act, kHeadDim>;
    // Above 48 KiB a kernel must opt in; setting the attribute is host-side bookkeeping, not a sync.
    DG_CUDA_TRY(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
    kernel<<<grid, kAttentionThreads, smem, stream>>>(p);
    DG_CUDA_TRY_LAUNCH("attention_kernel");
    return {};
  });
}

}  // namespace diffusion_gemma::cuda
