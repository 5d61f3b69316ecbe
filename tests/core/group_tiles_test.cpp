// SPDX-License-Identifier: Apache-2.0
// The row-tile mapping of the CUDA grouped GEMM (core/group_tiles.hpp) against a brute-force
// enumeration: every row of every group in exactly one tile, tiles in group order, the bound of
// the launch grid never below the real count.
#include <algorithm>
#include <cstdint>
#include <numeric>
#include <random>
#include <vector>

#include <diffusion_gemma/core/group_tiles.hpp>

#include "support/catch.hpp"

using namespace diffusion_gemma;

namespace {

// The tiles of a grouping, enumerated group by group, row block by row block.
std::vector<math::GroupTile> enumerate_tiles(const std::vector<int>& begin, int tile_rows) {
  std::vector<math::GroupTile> tiles;
  for (std::size_t g = 0; g + 1 < begin.size(); ++g) {
    for (int r = begin[g]; r < begin[g + 1]; r += tile_rows) {
      math::GroupTile t;
      t.group = static_cast<int>(g);
      t.first_row = r;
      t.rows = std::min(tile_rows, begin[g + 1] - r);
      tiles.push_back(t);
    }
  }
  return tiles;
}

std::vector<int> offsets(const std::vector<int>& sizes) {
  std::vector<int> begin(sizes.size() + 1, 0);
  std::partial_sum(sizes.begin(), sizes.end(), begin.begin() + 1);
  return begin;
}

void check_grouping(const std::vector<int>& sizes, int tile_rows) {
  const std::vector<int> begin = offsets(sizes);
  const int E = static_cast<int>(sizes.size());
  const int rows = begin.back();
  const std::vector<math::GroupTile> expected = enumerate_tiles(begin, tile_rows);
  const std::int64_t bound = math::max_group_tiles(rows, E, tile_rows);
  INFO("groups " << E << ", rows " << rows << ", tile rows " << tile_rows << ", tiles " << expected.size());
  REQUIRE(static_cast<std::int64_t>(expected.size()) <= bound);
  // The launcher's grid: every tile index up to the bound, the ones past the real count exit.
  std::vector<int> covered(static_cast<std::size_t>(rows), 0);
  for (std::int64_t i = 0; i < bound + 2; ++i) {
    math::GroupTile t;
    const bool found = math::find_group_tile(begin.data(), E, tile_rows, i, &t);
    if (i < static_cast<std::int64_t>(expected.size())) {
      REQUIRE(found);
      const math::GroupTile& want = expected[static_cast<std::size_t>(i)];
      CHECK(t.group == want.group);
      CHECK(t.first_row == want.first_row);
      CHECK(t.rows == want.rows);
      REQUIRE(t.rows >= 1);
      REQUIRE(t.rows <= tile_rows);
      REQUIRE(t.first_row >= begin[static_cast<std::size_t>(t.group)]);
      REQUIRE(t.first_row + t.rows <= begin[static_cast<std::size_t>(t.group) + 1]);
      for (int r = t.first_row; r < t.first_row + t.rows; ++r) ++covered[static_cast<std::size_t>(r)];
    } else {
      CHECK_FALSE(found);
    }
  }
  CHECK_FALSE(math::find_group_tile(begin.data(), E, tile_rows, -1, nullptr));
  CHECK(std::all_of(covered.begin(), covered.end(), [](int c) { return c == 1; }));
}

}  // namespace

TEST_CASE("find_group_tile equals a brute-force enumeration of the row tiles", "[core][group_tiles]") {
  SECTION("fixed shapes: empty groups, one group with every row, rows not a multiple of the tile") {
    check_grouping({}, 32);
    check_grouping({0}, 32);
    check_grouping({0, 0, 0}, 32);
    check_grouping({1}, 32);
    check_grouping({2048}, 32);        // the real shape's rows, all routed to one expert
    check_grouping({0, 2047, 0}, 32);  // one expert, not a multiple of the tile
    check_grouping({0, 0, 70, 0}, 32);
    check_grouping({31, 1, 32, 33, 0, 64, 65}, 32);
    check_grouping({5, 0, 7}, 1);
    check_grouping({5, 0, 7}, 100);
  }
  SECTION("random group sizes") {
    std::mt19937 rng(17);
    for (int trial = 0; trial < 300; ++trial) {
      const int E = std::uniform_int_distribution<int>(1, 160)(rng);
      const int tile_rows = std::vector<int>{1, 16, 32, 64}[static_cast<std::size_t>(trial % 4)];
      const double empty = std::uniform_real_distribution<double>(0.0, 0.9)(rng);
      const int max_size = std::vector<int>{3, 40, 300}[static_cast<std::size_t>(trial % 3)];
      std::vector<int> sizes(static_cast<std::size_t>(E));
      for (int& s : sizes) {
        s = std::uniform_real_distribution<double>(0.0, 1.0)(rng) < empty
                ? 0
                : std::uniform_int_distribution<int>(1, max_size)(rng);
      }
      check_grouping(sizes, tile_rows);
    }
  }
  SECTION("the real shape: 256 tokens top-8 over 128 experts, 32-row tiles") {
    std::mt19937 rng(3);
    std::vector<int> sizes(128, 0);
    for (int t = 0; t < 256; ++t) {
      std::vector<int> e(128);
      std::iota(e.begin(), e.end(), 0);
      std::shuffle(e.begin(), e.end(), rng);
      for (int j = 0; j < 8; ++j) ++sizes[static_cast<std::size_t>(e[static_cast<std::size_t>(j)])];
    }
    check_grouping(sizes, 32);
    CHECK(math::max_group_tiles(2048, 128, 32) == 64 + 128);
  }
}
