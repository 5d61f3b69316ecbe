// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <string>
#include <vector>

namespace dgemma {

int cmd_parity(const std::vector<std::string>& args);
int cmd_replay(const std::vector<std::string>& args);
int cmd_generate(const std::vector<std::string>& args);
int cmd_batch(const std::vector<std::string>& args);
int cmd_serve(const std::vector<std::string>& args);
int cmd_info(const std::vector<std::string>& args);
int cmd_quantize(const std::vector<std::string>& args);
int cmd_dequantize(const std::vector<std::string>& args);
int cmd_tokenize(const std::vector<std::string>& args, bool detokenize);

}  // namespace dgemma
