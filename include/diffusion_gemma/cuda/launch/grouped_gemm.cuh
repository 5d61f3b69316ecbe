// SPDX-License-Identifier: Apache-2.0
// Host launcher of the grouped GEMM (kernel/grouped_gemm.cuh): out[r] = in[r] W_g^T for the rows
// r of each group g, the group offsets on the device. One launch for all groups, sized for the
// worst case of the grouping, so the host never reads the group sizes: no synchronisation, no
// allocation, no workspace.
#pragma once

#include <cstdint>

#include <cuda_runtime_api.h>

#include <diffusion_gemma/core/group_tiles.hpp>
#include <diffusion_gemma/core/status.hpp>
#include <diffusion_gemma/cuda/kernel/grouped_gemm.cuh>
#include <diffusion_gemma/cuda/runtime.hpp>

namespace diffusion_gemma::cuda {

inline std::size_t grouped_gemm_workspace_bytes() { return 0; }

// The launch grid of a grouped GEMM over `rows` rows in `num_groups` groups, n output columns.
inline dim3 grouped_gemm_grid(int rows, int num_groups, int n) {
  const std::int64_t row_tiles = math::max_group_tiles(rows, num_groups, kGroupedTileM);
  const std::int64_t col_tiles = (static_cast<std::int64_t>(n) + kGroupedTileN - 1) / kGroupedTileN;
  return dim3(static_cast<unsigned>(row_tiles), static_cast<unsigned>(col_tiles));
}

// p.group_begin[0..num_groups] must be non-decreasing from >= 0 to <= p.rows (launch_moe_group's
// expert_begin is); it is read by the kernel, on the stream, after whatever wrote it.
template <class Act>
Status launch_grouped_gemm_nt(const GroupedGemmParams<Act>& p, cudaStream_t stream) {
  if (p.rows < 0 || p.num_groups < 0 || p.n < 0 || p.k < 0) {
    return make_status(StatusCode::kInvalidArgument, "grouped GEMM: negative size (rows ", p.rows, ", groups ",
                       p.num_groups, ", n ", p.n, ", k ", p.k, ")");
  }
  if (p.num_groups > kGroupedMaxGroups) {
    return make_status(StatusCode::kUnsupported, "grouped GEMM: ", p.num_groups, " groups (at most ",
                       kGroupedMaxGroups, ")");
  }
  if (p.rows == 0 || p.num_groups == 0 || p.n == 0) return {};
  const std::int64_t row_tiles = math::max_group_tiles(p.rows, p.num_groups, kGroupedTileM);
  const std::int64_t col_tiles = (static_cast<std::int64_t>(p.n) + kGroupedTileN - 1) / kGroupedTileN;
  if (row_tiles > 0x7fffffff || col_tiles > 65535) {
    return make_status(StatusCode::kOutOfRange, "grouped GEMM: ", row_tiles, " x ", col_tiles,
                       " tiles exceed the launch grid");
  }
  grouped_gemm_nt_kernel<Act><<<grouped_gemm_grid(p.rows, p.num_groups, p.n), kGroupedThreads, 0, stream>>>(p);
  DG_CUDA_TRY_LAUNCH("grouped_gemm_nt_kernel");
  return {};
}

}  // namespace diffusion_gemma::cuda
