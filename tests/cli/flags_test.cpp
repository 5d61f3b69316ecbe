// SPDX-License-Identifier: Apache-2.0
// dgemma's flag parser (examples/dgemma/cli.hpp): integers over the whole range a flag states,
// seeds over all 64 bits (as `dgemma serve` and batch files take them), and errors that name the
// flag and the accepted range; the inputs a command reads besides its flags (`parity --sc-logits`).
#include "support/catch.hpp"

#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include <diffusion_gemma/io/safetensors_writer.hpp>

#include "cli.hpp"
#include "sc_logits.hpp"
#include "support/paths.hpp"

using dgemma::Flags;
using dgemma::UsageError;

namespace {

Flags parsed(const std::vector<std::string>& args) {
  Flags f("generate", "test", {{"seed", "N", ""}, {"threads", "N", ""}, {"ids", "IDS", ""}});
  REQUIRE(f.parse(args));
  return f;
}

// The UsageError message of `fn`, or "" when it does not throw.
template <class Fn>
std::string error_of(Fn fn) {
  try {
    fn();
  } catch (const UsageError& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST_CASE("flags: an integer flag takes every value of the range it states", "[cli]") {
  // 2^62 + 1 is inside [0, 2^63 - 1]; it was refused as "out of range" without the range.
  CHECK(parsed({"--threads", "4611686018427387905"}).integer("threads", 0, 0, INT64_MAX) == 4611686018427387905LL);
  CHECK(parsed({"--threads", "9223372036854775807"}).integer("threads", 0, 0, INT64_MAX) == INT64_MAX);
  CHECK(parsed({"--threads=-9223372036854775808"}).integer("threads", 0, INT64_MIN, 0) == INT64_MIN);
  CHECK(parsed({"--threads=+7"}).integer("threads", 0, 0, 10) == 7);
  const std::string past = error_of([] { parsed({"--threads", "9223372036854775808"}).integer("threads", 0, 0, INT64_MAX); });
  CHECK(past.find("--threads") != std::string::npos);
  CHECK(past.find("out of range [0, 9223372036854775807]") != std::string::npos);
  const std::string huge = error_of([] { parsed({"--threads", "99999999999999999999999"}).integer("threads", 0, 0, 1024); });
  CHECK(huge.find("out of range [0, 1024]") != std::string::npos);
  CHECK(error_of([] { parsed({"--threads", "-1"}).integer("threads", 0, 0, 1024); }).find("-1 is out of range [0, 1024]") !=
        std::string::npos);
  for (const char* bad : {"", "-", "+", "1e3", "0x10", "12a", " 5", "--5"}) {
    INFO(bad);
    CHECK(error_of([bad] { parsed({std::string("--threads=") + bad}).integer("threads", 0, 0, 1024); })
              .find("is not an integer") != std::string::npos);
  }
  CHECK(parsed({"--ids", "0,9223372036854775807"}).integers("ids", 0, INT64_MAX) ==
        std::vector<std::int64_t>{0, INT64_MAX});
}

TEST_CASE("flags: --seed takes all 64 bits, as the server's \"seed\" and batch files do", "[cli]") {
  CHECK(parsed({}).unsigned_integer("seed", 7) == 7u);
  CHECK(parsed({"--seed", "0"}).unsigned_integer("seed", 7) == 0u);
  CHECK(parsed({"--seed", "18446744073709551615"}).unsigned_integer("seed", 0) == 18446744073709551615ull);
  CHECK(parsed({"--seed", "+42"}).unsigned_integer("seed", 0) == 42u);
  const std::string past = error_of([] { parsed({"--seed", "18446744073709551616"}).unsigned_integer("seed", 0); });
  CHECK(past.find("--seed") != std::string::npos);
  CHECK(past.find("out of range [0, 18446744073709551615]") != std::string::npos);
  CHECK(error_of([] { parsed({"--seed", "-1"}).unsigned_integer("seed", 0); }).find("out of range") != std::string::npos);
  for (const char* bad : {"", "-", "+", "1.5", "abc", "-x"}) {
    INFO(bad);
    CHECK(error_of([bad] { parsed({std::string("--seed=") + bad}).unsigned_integer("seed", 0); }).find("is not an integer") !=
          std::string::npos);
  }
}

TEST_CASE("parity --sc-logits: a NaN or +inf logit or a row without a finite one is refused, -inf is a logit", "[cli]") {
  namespace dg = diffusion_gemma;
  const std::string path = dg_test::temp_dir("sc_logits") + "/sc.safetensors";
  const auto write = [&](float x) {
    std::vector<float> v(2 * 5, 0.5f);
    v[1 * 5 + 3] = x;
    dg::io::SafetensorsWriter w;
    w.add("sc_logits", dg::Shape{2, 5}, v.data());
    w.write(path);
  };
  const auto error = [&] {
    try {
      (void)dgemma::read_sc_logits(path, 2, 5);
    } catch (const dg::Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  write(-std::numeric_limits<float>::infinity());
  CHECK(error().empty());
  CHECK(std::isinf(dgemma::read_sc_logits(path, 2, 5)[8]));
  write(std::numeric_limits<float>::quiet_NaN());
  CHECK(error().find("sc.safetensors: tensor 'sc_logits'[1, 3] is NaN") != std::string::npos);
  write(std::numeric_limits<float>::infinity());
  CHECK(error().find("'sc_logits'[1, 3] is +inf") != std::string::npos);
  CHECK_THROWS_AS(dgemma::read_sc_logits(path, 5, 2), dg::Error);  // the shape is checked first
  {
    std::vector<float> v(2 * 5, -std::numeric_limits<float>::infinity());
    v[2] = 1.0f;  // row 0 keeps one token, row 1 none
    dg::io::SafetensorsWriter w;
    w.add("sc_logits", dg::Shape{2, 5}, v.data());
    w.write(path);
  }
  CHECK(error().find("'sc_logits' row 1 is -inf everywhere") != std::string::npos);
}
