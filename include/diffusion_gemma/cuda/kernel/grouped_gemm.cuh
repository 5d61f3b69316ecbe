// SPDX-License-Identifier: Apache-2.0
// Grouped GEMM of the mixture of experts: for every group (expert) g with rows
// [begin[g], begin[g + 1]) of the grouped activations,
//   out[r, :] = in[r, :] W_g^T,  W_g = weights + g * n * k  ([n, k] row-major, a torch Linear),
// with the group offsets read from device memory, so that no size goes through the host. in and
// the weights are in the storage type (float or bfloat16), widened on load; out is fp32 and every
// output is one fp32 chain of fused multiply-adds over k in ascending order.
//
// Tiling: a block computes a kGroupedTileM x kGroupedTileN tile of one group's rows with
// kGroupedThreads threads; k advances in steps of kGroupedTileK through shared memory (fp32, one
// padding column against bank conflicts). blockIdx.x is a row tile in the numbering of
// core/group_tiles.hpp, found from the group offsets staged in shared memory (blocks past the last
// real tile exit); blockIdx.y is a column tile. Plain SIMT FMAs: correctness first, no tensor cores.
#pragma once

#include <cstdint>

#include <diffusion_gemma/core/group_tiles.hpp>
#include <diffusion_gemma/core/macros.hpp>
#include <diffusion_gemma/cuda/device/convert.cuh>

namespace diffusion_gemma::cuda {

inline constexpr int kGroupedTileM = 32;     // rows of a tile
inline constexpr int kGroupedTileN = 64;     // output columns of a tile
inline constexpr int kGroupedTileK = 32;     // k per shared-memory step
inline constexpr int kGroupedThreadsX = 16;  // a thread's columns: tx + 16 * j, j < 4
inline constexpr int kGroupedThreadsY = 16;  // a thread's rows: ty * 2 + i, i < 2
inline constexpr int kGroupedThreads = kGroupedThreadsX * kGroupedThreadsY;
inline constexpr int kGroupedRowsPerThread = kGroupedTileM / kGroupedThreadsY;
inline constexpr int kGroupedColsPerThread = kGroupedTileN / kGroupedThreadsX;
inline constexpr int kGroupedMaxGroups = 256;  // group offsets staged in shared memory (the router's limit)

template <class Act>
struct GroupedGemmParams {
  const Act* in = nullptr;           // [rows, k], grouped by group
  const Act* weights = nullptr;      // [num_groups, n, k]
  const int* group_begin = nullptr;  // [num_groups + 1] on the device: begin[num_groups] <= rows
  float* out = nullptr;              // [rows, n]; rows outside every group are not written
  int rows = 0;                      // rows of in and out (sizes the grid; the groups may use fewer)
  int num_groups = 0;                // 0..kGroupedMaxGroups
  int n = 0;
  int k = 0;
};

// Launched with kGroupedThreads threads, grid (max_group_tiles(rows, num_groups, kGroupedTileM),
// ceil(n / kGroupedTileN)).
template <class Act>
__global__ void __launch_bounds__(kGroupedThreads) grouped_gemm_nt_kernel(GroupedGemmParams<Act> p) {
  static_assert(kGroupedTileM % kGroupedThreadsY == 0 && kGroupedTileN % kGroupedThreadsX == 0,
                "grouped GEMM: the tile splits evenly over the threads");
  static_assert((kGroupedTileM * kGroupedTileK) % kGroupedThreads == 0 &&
                    (kGroupedTileN * kGroupedTileK) % kGroupedThreads == 0,
                "grouped GEMM: the shared tiles load evenly");
  __shared__ float a_tile[kGroupedTileM][kGroupedTileK + 1];
  __shared__ float b_tile[kGroupedTileN][kGroupedTileK + 1];
  __shared__ int begin[kGroupedMaxGroups + 1];
  __shared__ int tile_info[3];  // group (-1: past the last tile), first row, rows

  // The offsets in one parallel load, then one thread walks them (core/group_tiles.hpp).
  const int tid = static_cast<int>(threadIdx.x);
  for (int g = tid; g <= p.num_groups; g += kGroupedThreads) begin[g] = p.group_begin[g];
  __syncthreads();
  if (tid == 0) {
    math::GroupTile t;
    const bool found =
        math::find_group_tile(begin, p.num_groups, kGroupedTileM, static_cast<std::int64_t>(blockIdx.x), &t);
    tile_info[0] = found ? t.group : -1;
    tile_info[1] = t.first_row;
    tile_info[2] = t.rows;
  }
  __syncthreads();
  const int group = tile_info[0];
  if (group < 0) return;  // the whole block: past the last tile of the grouping
  const int row0 = tile_info[1];
  const int tile_rows = tile_info[2];
  const int col0 = static_cast<int>(blockIdx.y) * kGroupedTileN;
  const int n = p.n, k = p.k;
  const Act* a = p.in + static_cast<std::int64_t>(row0) * k;
  const Act* w = p.weights + (static_cast<std::int64_t>(group) * n + col0) * k;
  const int cols = n - col0 < kGroupedTileN ? n - col0 : kGroupedTileN;  // >= 1 by the grid

  const int tx = tid % kGroupedThreadsX;
  const int ty = tid / kGroupedThreadsX;
  float acc[kGroupedRowsPerThread][kGroupedColsPerThread];
#pragma unroll
  for (int i = 0; i < kGroupedRowsPerThread; ++i) {
#pragma unroll
    for (int j = 0; j < kGroupedColsPerThread; ++j) acc[i][j] = 0.0f;
  }

  for (int k0 = 0; k0 < k; k0 += kGroupedTileK) {
    // Stage the tiles (k fastest: consecutive threads read consecutive elements), zeros outside.
#pragma unroll
    for (int q = 0; q < kGroupedTileM * kGroupedTileK / kGroupedThreads; ++q) {
      const int e = tid + q * kGroupedThreads;
      const int r = e / kGroupedTileK, c = e % kGroupedTileK;
      a_tile[r][c] = r < tile_rows && k0 + c < k ? as_float(a[static_cast<std::int64_t>(r) * k + k0 + c]) : 0.0f;
    }
#pragma unroll
    for (int q = 0; q < kGroupedTileN * kGroupedTileK / kGroupedThreads; ++q) {
      const int e = tid + q * kGroupedThreads;
      const int r = e / kGroupedTileK, c = e % kGroupedTileK;
      b_tile[r][c] = r < cols && k0 + c < k ? as_float(w[static_cast<std::int64_t>(r) * k + k0 + c]) : 0.0f;
    }
    __syncthreads();
    // Only the real k of the last step: the chain is exactly the k products in order.
    const int steps = k - k0 < kGroupedTileK ? k - k0 : kGroupedTileK;
#pragma unroll 8
    for (int c = 0; c < steps; ++c) {
      float av[kGroupedRowsPerThread];
      float bv[kGroupedColsPerThread];
#pragma unroll
      for (int i = 0; i < kGroupedRowsPerThread; ++i) av[i] = a_tile[ty * kGroupedRowsPerThread + i][c];
#pragma unroll
      for (int j = 0; j < kGroupedColsPerThread; ++j) bv[j] = b_tile[tx + j * kGroupedThreadsX][c];
#pragma unroll
      for (int i = 0; i < kGroupedRowsPerThread; ++i) {
#pragma unroll
        for (int j = 0; j < kGroupedColsPerThread; ++j) acc[i][j] = fmaf(av[i], bv[j], acc[i][j]);
      }
    }
    __syncthreads();  // before the next step overwrites the tiles
  }

#pragma unroll
  for (int i = 0; i < kGroupedRowsPerThread; ++i) {
    const int r = ty * kGroupedRowsPerThread + i;
    if (r >= tile_rows) continue;
    float* o = p.out + static_cast<std::int64_t>(row0 + r) * n + col0;
#pragma unroll
    for (int j = 0; j < kGroupedColsPerThread; ++j) {
      const int c = tx + j * kGroupedThreadsX;
      if (c < cols) o[c] = acc[i][j];
    }
  }
}

}  // namespace diffusion_gemma::cuda
