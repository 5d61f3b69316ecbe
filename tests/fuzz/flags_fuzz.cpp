// SPDX-License-Identifier: Apache-2.0
// libFuzzer target: dgemma's flag parser on arbitrary argument vectors (NUL-separated input),
// then every typed accessor. Must succeed or throw UsageError; nothing else.
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "../../examples/dgemma/cli.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  std::vector<std::string> args;
  std::string cur;
  for (std::size_t i = 0; i < size; ++i) {
    if (data[i] == 0) {
      args.push_back(cur);
      cur.clear();
    } else {
      cur.push_back(static_cast<char>(data[i]));
    }
  }
  args.push_back(cur);
  dgemma::Flags f("generate", "fuzz",
                  {{"model", "DIR", ""}, {"prompt-ids", "IDS", ""}, {"seed", "N", ""}, {"t-min", "T", ""},
                   {"chat", "", ""}, {"view", "", ""}, {"max-new-tokens", "N", ""}});
  try {
    if (!f.parse(args)) return 0;
    (void)f.str("model");
    (void)f.flag("chat");
    (void)f.flag("view", true);
    (void)f.integer("seed", 0, 0, INT64_MAX);
    (void)f.unsigned_integer("seed", 0);
    (void)f.integer("max-new-tokens", 256, 1, 1 << 24);
    (void)f.number("t-min", 0.4, 0.0, 1e6);
    if (f.has("prompt-ids")) (void)f.integers("prompt-ids", 0, 262143);
    (void)f.usage();
  } catch (const dgemma::UsageError&) {
  }
  return 0;
}
