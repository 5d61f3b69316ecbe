// SPDX-License-Identifier: Apache-2.0
// Row tiles of a grouped product (the CUDA back-end's grouped GEMM over the rows of each expert):
// group g owns rows [begin[g], begin[g + 1]) and is cut into ceil(n_g / tile_rows) tiles of
// tile_rows rows, the last one partial; tiles are numbered group by group, empty groups own none.
// The launcher sizes its grid for the worst case without reading the group sizes
// (max_group_tiles); each block finds its tile from the device array with find_group_tile and
// exits past the last one. Host and device share this code (tests/core checks it on the CPU).
#pragma once

#include <cstdint>

#include <diffusion_gemma/core/macros.hpp>

namespace diffusion_gemma::math {

struct GroupTile {
  int group = -1;     // the tile's group
  int first_row = 0;  // its first row (an absolute row index: begin[group] + i * tile_rows)
  int rows = 0;       // 1..tile_rows rows of the group
};

// An upper bound of the number of tiles over any grouping of `rows` rows into `num_groups`
// groups: ceil(n / b) <= floor(n / b) + [n > 0], the floors sum to at most floor(rows / b) and at
// most min(num_groups, rows) groups are non-empty.
DG_HOST_DEVICE std::int64_t max_group_tiles(std::int64_t rows, std::int64_t num_groups, int tile_rows) {
  return rows / tile_rows + (num_groups < rows ? num_groups : rows);
}

// Tile `tile` of the grouping begin[0..num_groups] (non-decreasing, begin[0] >= 0): true and the
// tile in *out, or false when `tile` is past the last tile. A linear scan over the groups (at most
// a few hundred experts, read once per block).
DG_HOST_DEVICE bool find_group_tile(const int* begin, int num_groups, int tile_rows, std::int64_t tile,
                                    GroupTile* out) {
  if (tile < 0) return false;
  std::int64_t first = 0;  // the first tile of group g
  for (int g = 0; g < num_groups; ++g) {
    const int b = begin[g];
    const int n = begin[g + 1] - b;
    const std::int64_t tiles = (static_cast<std::int64_t>(n) + tile_rows - 1) / tile_rows;
    if (tile < first + tiles) {
      const int i = static_cast<int>(tile - first);
      out->group = g;
      out->first_row = b + i * tile_rows;
      const int left = n - i * tile_rows;
      out->rows = left < tile_rows ? left : tile_rows;
      return true;
    }
    first += tiles;
  }
  return false;
}

}  // namespace diffusion_gemma::math
