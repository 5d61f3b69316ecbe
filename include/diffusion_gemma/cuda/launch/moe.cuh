// SPDX-License-Identifier: Apache-2.0
// Host launchers of the mixture-of-experts kernels (kernel/moe.cuh) and the CUB grouping of the
// routed slots by expert. The expert GEMMs between gather and combine (launch/grouped_gemm.cuh)
// read the groups' offsets, expert_begin, on the device: nothing here goes back to the host.
#pragma once

#include <cstdint>

#include <cub/device/device_radix_sort.cuh>
#include <cuda_runtime_api.h>

#include <diffusion_gemma/core/status.hpp>
#include <diffusion_gemma/cuda/kernel/moe.cuh>
#include <diffusion_gemma/cuda/runtime.hpp>

namespace diffusion_gemma::cuda {

inline Status can_route(int num_experts, int k) {
  if (num_experts <= 0 || num_experts > kMaxExperts) {
    return make_status(StatusCode::kUnsupported, "MoE: ", num_experts, " experts (the CUDA router supports 1..",
                       kMaxExperts, ")");
  }
  if (k <= 0 || k > num_experts || k > kMaxTopK) {
    return make_status(StatusCode::kUnsupported, "MoE: top_k ", k, " (the CUDA router supports 1..", kMaxTopK, ")");
  }
  return {};
}

inline std::size_t router_workspace_bytes() { return 0; }

// logits [tokens, E] -> slot_weight, slot_expert, slot_id [tokens * k].
inline Status launch_router(const float* logits, int tokens, int num_experts, int k, const float* per_expert_scale,
                            float* slot_weight, int* slot_expert, int* slot_id, cudaStream_t stream) {
  Status s = can_route(num_experts, k);
  if (!s.ok() || tokens == 0) return s;
  constexpr int kThreads = 64;  // each thread keeps E probabilities in local memory
  router_kernel<0><<<static_cast<unsigned>((tokens + kThreads - 1) / kThreads), kThreads, 0, stream>>>(
      logits, tokens, num_experts, k, per_expert_scale, slot_weight, slot_expert, slot_id);
  DG_CUDA_TRY_LAUNCH("router_kernel");
  return {};
}

struct MoeGroupParams {
  const int* slot_expert = nullptr;  // [n]
  const int* slot_id = nullptr;      // [n]: 0..n-1
  int* sorted_expert = nullptr;      // [n]
  int* sorted_slot = nullptr;        // [n]: slots grouped by expert, ascending within a group
  int* expert_begin = nullptr;       // [E + 1]
  int n = 0;
  int num_experts = 0;
};

inline int expert_bits(int num_experts) {
  int bits = 1;
  while ((1 << bits) < num_experts) ++bits;
  return bits;
}

// CUB's temporary storage for grouping n slots over E experts.
inline std::size_t moe_group_workspace_bytes(int n, int num_experts) {
  std::size_t bytes = 0;
  const cudaError_t err = cub::DeviceRadixSort::SortPairs(nullptr, bytes, static_cast<const int*>(nullptr),
                                                          static_cast<int*>(nullptr), static_cast<const int*>(nullptr),
                                                          static_cast<int*>(nullptr), n, 0, expert_bits(num_experts));
  return err == cudaSuccess ? bytes : 0;
}

// Stable radix sort of the slots by expert (only the bits an expert id needs), then offsets.
inline Status launch_moe_group(const MoeGroupParams& p, void* workspace, std::size_t workspace_bytes,
                               cudaStream_t stream) {
  if (p.n == 0) return {};
  std::size_t bytes = workspace_bytes;
  DG_CUDA_TRY(cub::DeviceRadixSort::SortPairs(workspace, bytes, p.slot_expert, p.sorted_expert, p.slot_id,
                                              p.sorted_slot, p.n, 0, expert_bits(p.num_experts), stream));
  constexpr int kThreads = 128;
  expert_offsets_kernel<0><<<static_cast<unsigned>((p.num_experts + kThreads) / kThreads), kThreads, 0, stream>>>(
      p.sorted_expert, p.n, p.num_experts, p.expert_begin);
  DG_CUDA_TRY_LAUNCH("expert_offsets_kernel");
  return {};
}

template <class Act>
Status launch_gather_rows(const Act* x, const int* sorted_slot, int n, int k, int hidden, Act* out, int* row_of_slot,
                          cudaStream_t stream) {
  if (n == 0) return {};
  gather_rows_kernel<Act><<<static_cast<unsigned>(n), 256, 0, stream>>>(x, sorted_slot, n, k, hidden, out, row_of_slot);
  DG_CUDA_TRY_LAUNCH("gather_rows_kernel");
  return {};
}

inline Status launch_moe_combine(const float* y, const float* slot_weight, const int* slot_expert,
                                 const int* row_of_slot, int tokens, int k, int hidden, float* out,
                                 cudaStream_t stream) {
  if (tokens == 0) return {};
  if (k > kMaxTopK) return make_status(StatusCode::kUnsupported, "MoE combine: top_k ", k, " exceeds ", kMaxTopK);
  moe_combine_kernel<0><<<static_cast<unsigned>(tokens), 256, 0, stream>>>(y, slot_weight, slot_expert, row_of_slot,
                                                                          k, hidden, out);
  DG_CUDA_TRY_LAUNCH("moe_combine_kernel");
  return {};
}

}  // namespace diffusion_gemma::cuda
