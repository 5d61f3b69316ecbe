// SPDX-License-Identifier: Apache-2.0
#include <cmath>
#include <set>
#include <vector>

#include <diffusion_gemma/core/rng.hpp>

#include "support/catch.hpp"

using namespace diffusion_gemma;

TEST_CASE("Philox4x32-10 matches the Random123 known-answer vectors", "[core][rng]") {
  auto r = philox4x32_10(Philox4x32{{0, 0, 0, 0}}, 0, 0);
  CHECK(r.v[0] == 0x6627e8d5u);
  CHECK(r.v[1] == 0xe169c58du);
  CHECK(r.v[2] == 0xbc57ac4cu);
  CHECK(r.v[3] == 0x9b00dbd8u);
  r = philox4x32_10(Philox4x32{{0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu}}, 0xffffffffu, 0xffffffffu);
  CHECK(r.v[0] == 0x408f276du);
  CHECK(r.v[1] == 0x41c83b0eu);
  CHECK(r.v[2] == 0xa20bc7c6u);
  CHECK(r.v[3] == 0x6d5451fdu);
  r = philox4x32_10(Philox4x32{{0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u}}, 0xa4093822u, 0x299f31d0u);
  CHECK(r.v[0] == 0xd16cfe09u);
  CHECK(r.v[1] == 0x94fdccebu);
  CHECK(r.v[2] == 0x5001e420u);
  CHECK(r.v[3] == 0x24126ea1u);
}

TEST_CASE("draws are keyed by every field", "[core][rng]") {
  const DrawKey base{42, 3, 7};
  const auto a = draw(base, DrawPurpose::kSample, 5, 0).v[0];
  CHECK(draw(base, DrawPurpose::kSample, 5, 0).v[0] == a);  // pure function
  std::set<std::uint32_t> distinct{a};
  distinct.insert(draw(DrawKey{43, 3, 7}, DrawPurpose::kSample, 5, 0).v[0]);
  distinct.insert(draw(DrawKey{42, 4, 7}, DrawPurpose::kSample, 5, 0).v[0]);
  distinct.insert(draw(DrawKey{42, 3, 8}, DrawPurpose::kSample, 5, 0).v[0]);
  distinct.insert(draw(base, DrawPurpose::kRenoise, 5, 0).v[0]);
  distinct.insert(draw(base, DrawPurpose::kSample, 6, 0).v[0]);
  distinct.insert(draw(base, DrawPurpose::kSample, 5, 1).v[0]);
  CHECK(distinct.size() == 7);
}

TEST_CASE("uniform helpers stay in range and are unbiased", "[core][rng]") {
  CHECK(uniform_open01(0u) > 0.0f);
  CHECK(uniform_open01(0xffffffffu) < 1.0f);
  // Chi-square of 64 bins over 64k draws: with 63 degrees of freedom, 120 is far in the tail.
  std::vector<int> bins(64, 0);
  const int n = 65536;
  for (int i = 0; i < n; ++i) ++bins[uniform_below(draw(DrawKey{9, 0, 0}, DrawPurpose::kInit, i, 0).v[0], 64)];
  double chi2 = 0.0;
  for (int b : bins) chi2 += (b - n / 64.0) * (b - n / 64.0) / (n / 64.0);
  CHECK(chi2 < 120.0);
  CHECK(uniform_below(0xffffffffu, 262144) == 262143u);
}
