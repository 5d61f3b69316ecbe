// SPDX-License-Identifier: Apache-2.0
#include <cmath>
#include <cstdint>
#include <limits>

#include <diffusion_gemma/core/bfloat16.hpp>
#include <diffusion_gemma/core/float16.hpp>
#include <diffusion_gemma/core/status.hpp>
#include <diffusion_gemma/core/tensor_view.hpp>

#include "support/catch.hpp"

using namespace diffusion_gemma;

TEST_CASE("bfloat16 rounds to nearest even and widens exactly", "[core][bf16]") {
  // 1 + 2^-8 is exactly halfway between bf16 1.0 and 1.0078125: ties go to the even mantissa (1.0).
  CHECK(bfloat16::from_float(1.0f + std::ldexp(1.0f, -8)).to_float() == 1.0f);
  // 1 + 3 * 2^-8 is halfway between 1.0078125 (odd) and 1.015625 (even): rounds up.
  CHECK(bfloat16::from_float(1.0f + 3 * std::ldexp(1.0f, -8)).to_float() == 1.015625f);
  // Just above halfway rounds up.
  CHECK(bfloat16::from_float(1.0f + std::ldexp(1.0f, -8) + std::ldexp(1.0f, -20)).to_float() == 1.0078125f);
  // sqrt(2816) -> 53.0: the embedding scale of the real checkpoint.
  CHECK(bfloat16::from_float(std::sqrt(2816.0f)).to_float() == 53.0f);
  CHECK(std::isnan(bfloat16::from_float(std::numeric_limits<float>::quiet_NaN()).to_float()));
  CHECK(std::isinf(bfloat16::from_float(std::numeric_limits<float>::infinity()).to_float()));
  CHECK(bfloat16::from_float(-0.0f).bits == 0x8000);
  // Every bf16 bit pattern that is not NaN survives a round trip through float.
  for (std::uint32_t b = 0; b < 0x10000; ++b) {
    const auto h = bfloat16::from_bits(static_cast<std::uint16_t>(b));
    const float f = h.to_float();
    if (std::isnan(f)) continue;
    REQUIRE(bfloat16::from_float(f).bits == h.bits);
  }
}

TEST_CASE("float16 conversions are exact for every half value and round to even", "[core][f16]") {
  for (std::uint32_t b = 0; b < 0x10000; ++b) {
    const auto h = float16::from_bits(static_cast<std::uint16_t>(b));
    const float f = h.to_float();
    if (std::isnan(f)) {
      REQUIRE(std::isnan(float16::from_float(f).to_float()));
      continue;
    }
    REQUIRE(float16::from_float(f).bits == h.bits);
  }
  CHECK(float16::from_bits(0x3c00).to_float() == 1.0f);
  CHECK(float16::from_bits(0x0001).to_float() == std::ldexp(1.0f, -24));  // smallest subnormal
  CHECK(float16::from_float(65504.0f).bits == 0x7bff);
  CHECK(float16::from_float(65520.0f).bits == 0x7c00);  // rounds to Inf
  CHECK(float16::from_float(1.0f + std::ldexp(1.0f, -11)).bits == 0x3c00);  // tie to even
  CHECK(float16::from_float(1.0f + 3 * std::ldexp(1.0f, -11)).bits == 0x3c02);
  CHECK(float16::from_float(std::ldexp(1.0f, -25)).bits == 0x0000);  // tie to even (zero)
  CHECK(float16::from_float(std::ldexp(1.5f, -25)).bits == 0x0001);
}

TEST_CASE("Status and Error carry the code and the message", "[core][status]") {
  const Status s = make_status(StatusCode::kNotFound, "file ", 7, " missing");
  CHECK_FALSE(s.ok());
  CHECK(s.message() == "file 7 missing");
  try {
    throw_error(StatusCode::kFormatError, "a", "b", 3);
    FAIL("no throw");
  } catch (const Error& e) {
    CHECK(e.code() == StatusCode::kFormatError);
    CHECK(std::string(e.what()) == "ab3");
  }
  CHECK(enum_valid(StatusCode::kCancelled));
  CHECK_FALSE(enum_valid(StatusCode::kSentinel));
}

TEST_CASE("TensorView indexes row-major", "[core][tensor]") {
  float data[24];
  for (int i = 0; i < 24; ++i) data[i] = static_cast<float>(i);
  TensorView<float> v(data, {2, 3, 4});
  CHECK(v.numel() == 24);
  CHECK(v(1, 2, 3) == 23.0f);
  CHECK(v(0, 1, 0) == 4.0f);
  CHECK(v.shape.str() == "[2, 3, 4]");
}
