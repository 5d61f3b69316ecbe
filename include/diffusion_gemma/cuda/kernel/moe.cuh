// SPDX-License-Identifier: Apache-2.0
// Mixture-of-experts kernels (docs/model.md §3.5-3.6). The flow, with slots s = t * K + j for token t
// and its j-th routed expert:
//   router_kernel         logits [T, E] -> top-k weights and experts per slot (device/router.cuh)
//   (CUB radix sort)      slots grouped by expert, stable: ascending slot order inside a group
//   expert_offsets_kernel first grouped row of each expert
//   gather_rows_kernel    the expert inputs of the grouped rows, and each slot's grouped row
//   (grouped GEMMs, kernel/grouped_gemm.cuh, and gelu_gate_kernel over the grouped rows)
//   moe_combine_kernel    out[t] = sum over the token's slots in ascending expert order of y * w,
//                         the order transformers' index_add and the CPU back-end use
#pragma once

#include <cstdint>

#include <diffusion_gemma/core/macros.hpp>
#include <diffusion_gemma/cuda/device/convert.cuh>
#include <diffusion_gemma/cuda/device/router.cuh>

namespace diffusion_gemma::cuda {

inline constexpr int kMaxExperts = 256;  // router scratch per thread
inline constexpr int kMaxTopK = 64;      // as cpu::Engine

// One thread per token. Writes weights and experts of the token's K slots and the slot ids that
// the grouping sort carries along. (Kernels without a natural template parameter take a dummy
// one: nvcc ignores `inline` on __global__, and a template is defined once per program.)
template <int kUnused = 0>
__global__ void router_kernel(const float* logits, int tokens, int num_experts, int k,
                                const float* per_expert_scale, float* slot_weight, int* slot_expert, int* slot_id) {
  const int t = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
  if (t >= tokens) return;
  float probs[kMaxExperts];
  const std::int64_t s0 = static_cast<std::int64_t>(t) * k;
  route_token(logits + static_cast<std::int64_t>(t) * num_experts, num_experts, k, per_expert_scale, probs,
              slot_weight + s0, slot_expert + s0);
  for (int j = 0; j < k; ++j) slot_id[s0 + j] = static_cast<int>(s0 + j);
}

// begin[e] = first grouped row of expert e (lower bound in the sorted experts); begin[E] = n.
template <int kUnused = 0>
__global__ void expert_offsets_kernel(const int* sorted_expert, int n, int num_experts, int* begin) {
  const int e = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
  if (e > num_experts) return;
  int lo = 0, hi = n;
  while (lo < hi) {
    const int mid = (lo + hi) / 2;
    if (sorted_expert[mid] < e) {
      lo = mid + 1;
    } else {
      hi = mid;
    }
  }
  begin[e] = e == num_experts ? n : lo;
}

// Grouped row j gets the expert input of its token; row_of_slot inverts the grouping. One block
// per grouped row.
template <class Act>
__global__ void gather_rows_kernel(const Act* x, const int* sorted_slot, int n, int k, int hidden, Act* out,
                                   int* row_of_slot) {
  const int j = static_cast<int>(blockIdx.x);
  if (j >= n) return;
  const int slot = sorted_slot[j];
  const Act* src = x + static_cast<std::int64_t>(slot / k) * hidden;
  Act* dst = out + static_cast<std::int64_t>(j) * hidden;
  for (int i = static_cast<int>(threadIdx.x); i < hidden; i += static_cast<int>(blockDim.x)) dst[i] = src[i];
  if (threadIdx.x == 0) row_of_slot[slot] = j;
}

// out[t, :] = sum_j y[row_of_slot[s_j], :] * w[s_j] over the token's slots in ascending expert
// order, each product rounded before the add (__fmul_rn keeps nvcc from contracting it into an
// FMA), as the CPU forms the weighted rows first and then sums them. One block per token.
template <int kUnused = 0>
__global__ void moe_combine_kernel(const float* y, const float* slot_weight, const int* slot_expert,
                                   const int* row_of_slot, int k, int hidden, float* out) {
  __shared__ int order[kMaxTopK];
  const std::int64_t t = blockIdx.x;
  const std::int64_t s0 = t * k;
  if (threadIdx.x == 0) {
    for (int j = 0; j < k; ++j) order[j] = j;
    for (int a = 1; a < k; ++a) {  // insertion sort by expert; a token's experts are distinct
      const int v = order[a];
      int b = a - 1;
      while (b >= 0 && slot_expert[s0 + order[b]] > slot_expert[s0 + v]) {
        order[b + 1] = order[b];
        --b;
      }
      order[b + 1] = v;
    }
  }
  __syncthreads();
  for (int i = static_cast<int>(threadIdx.x); i < hidden; i += static_cast<int>(blockDim.x)) {
    float acc = 0.0f;
    for (int j = 0; j < k; ++j) {
      const std::int64_t s = s0 + order[j];
      acc = __fadd_rn(acc, __fmul_rn(y[static_cast<std::int64_t>(row_of_slot[s]) * hidden + i], slot_weight[s]));
    }
    out[t * hidden + i] = acc;
  }
}

}  // namespace diffusion_gemma::cuda
