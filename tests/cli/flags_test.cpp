// SPDX-License-Identifier: Apache-2.0
// dgemma's flag parser (examples/dgemma/cli.hpp): integers over the whole range a flag states,
// seeds over all 64 bits (as `dgemma serve` and batch files take them), and errors that name the
// flag and the accepted range.
#include "support/catch.hpp"

#include <cstdint>
#include <string>
#include <vector>

#include "cli.hpp"

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
