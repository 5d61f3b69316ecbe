// SPDX-License-Identifier: Apache-2.0
// OpenAI's response objects for both endpoints: whole answers, stream chunks, usage, and the
// draft chunks of the opt-in extension (docs/serving.md §4). A draft travels in the "dgemma" field
// of a chunk whose delta is empty, so that an OpenAI client reads it as a chunk without content.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

namespace dgemma::serve {

class ResponseShape {
 public:
  using json = nlohmann::ordered_json;

  ResponseShape(bool chat, std::string id, std::int64_t created, std::string model)
      : chat_(chat), id_(std::move(id)), created_(created), model_(std::move(model)) {}

  static json usage(int prompt_tokens, int completion_tokens) {
    return json{{"prompt_tokens", prompt_tokens},
                {"completion_tokens", completion_tokens},
                {"total_tokens", prompt_tokens + completion_tokens}};
  }

  struct Choice {
    std::string text;
    const char* finish_reason = nullptr;
  };

  // The whole answer of a request without "stream": its choices in order (index 0, 1, ...).
  json answer(const std::vector<Choice>& choices, const json& usage) const {
    json list = json::array();
    for (std::size_t i = 0; i < choices.size(); ++i) {
      json choice{{"index", i}};
      if (chat_) {
        choice["message"] = json{{"role", "assistant"}, {"content", choices[i].text}};
      } else {
        choice["text"] = choices[i].text;
      }
      choice["logprobs"] = nullptr;
      choice["finish_reason"] = choices[i].finish_reason;
      list.push_back(std::move(choice));
    }
    json j = head(chat_ ? "chat.completion" : "text_completion");
    j["choices"] = std::move(list);
    j["usage"] = usage;
    return j;
  }

  // A stream chunk with a text delta for choice `index`. `role` only on a chat stream's first
  // chunk, as OpenAI sends it.
  json chunk(const std::string& text, const char* finish_reason, bool role = false, std::size_t index = 0) const {
    json choice{{"index", index}};
    if (chat_) {
      json delta = json::object();
      if (role) delta["role"] = "assistant";
      delta["content"] = text;
      choice["delta"] = delta;
    } else {
      choice["text"] = text;
    }
    choice["logprobs"] = nullptr;
    choice["finish_reason"] = finish_reason ? json(finish_reason) : json(nullptr);
    json j = head(chat_ ? "chat.completion.chunk" : "text_completion");
    j["choices"] = json::array({choice});
    return j;
  }

  // A chunk without content: chat's delta is {}, completions' text is "".
  json empty_chunk(std::size_t index = 0) const {
    json choice{{"index", index}};
    if (chat_) {
      choice["delta"] = json::object();
    } else {
      choice["text"] = "";
    }
    choice["logprobs"] = nullptr;
    choice["finish_reason"] = nullptr;
    json j = head(chat_ ? "chat.completion.chunk" : "text_completion");
    j["choices"] = json::array({choice});
    return j;
  }

  // stream_options.include_usage: OpenAI's last chunk, with no choices and the usage.
  json usage_chunk(const json& usage) const {
    json j = head(chat_ ? "chat.completion.chunk" : "text_completion");
    j["choices"] = json::array();
    j["usage"] = usage;
    return j;
  }

 private:
  json head(const char* object) const {
    return json{{"id", id_}, {"object", object}, {"created", created_}, {"model", model_}};
  }
  bool chat_;
  std::string id_;
  std::int64_t created_;
  std::string model_;
};

}  // namespace dgemma::serve
