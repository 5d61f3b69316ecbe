// SPDX-License-Identifier: Apache-2.0
// Server-sent events as OpenAI streams them: one `data: <json>` event per chunk, a blank line after
// each, and `data: [DONE]` last. Comment lines (": ...") keep an idle stream writing, so that a
// client that went away is noticed (a write to a closed socket fails) even between canvases.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

namespace dgemma::serve {

// Text that may hold any bytes is dumped with invalid UTF-8 replaced rather than throwing.
template <class Json>
std::string dump_json(const Json& j) {
  return j.dump(-1, ' ', false, Json::error_handler_t::replace);
}

template <class Json>
std::string sse_data(const Json& j) {
  return "data: " + dump_json(j) + "\n\n";
}

inline std::string sse_done() { return "data: [DONE]\n\n"; }
inline std::string sse_comment(const std::string& text) { return ": " + text + "\n\n"; }

}  // namespace dgemma::serve
