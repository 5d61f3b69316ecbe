// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cstdlib>
#include <string>

#include <unistd.h>

namespace dg_test {

// DG_TEST_FIXTURES overrides the source tree's folder: prebuilt test binaries carried to another
// machine (scripts/gpu-build.sh) read the fixtures carried beside them.
inline std::string fixtures_dir() {
  const char* dir = std::getenv("DG_TEST_FIXTURES");
  return dir != nullptr && *dir != '\0' ? dir : DG_TEST_FIXTURES_DIR;
}
inline std::string fixture(const std::string& rel) { return fixtures_dir() + "/" + rel; }

// A fresh directory under the build tree's temp, removed by nobody: tests write small files only.
inline std::string temp_dir(const std::string& name) {
  const char* base = std::getenv("TMPDIR");
  std::string dir = std::string(base ? base : "/tmp") + "/dg_test_" + std::to_string(::getpid()) + "_" + name;
  const std::string cmd = "mkdir -p '" + dir + "'";
  if (std::system(cmd.c_str()) != 0) return "/tmp";
  return dir;
}

}  // namespace dg_test
