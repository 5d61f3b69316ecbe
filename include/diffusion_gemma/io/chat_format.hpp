// SPDX-License-Identifier: Apache-2.0
// The Gemma 4 chat format (docs/model.md §8.3), text-only:
//
//   <bos>[<|turn>system\n[<|think|>\n]SYSTEM<turn|>\n](<|turn>user\nUSER<turn|>\n | <|turn>model\nMODEL<turn|>\n)*
//   [<|turn>model\n]                                                     (the generation prompt)
//
// render_chat() reproduces what the checkpoint's Jinja chat template renders for conversations without tools or
// media: contents are trimmed with Python's str.strip(); past model turns lose their thinking
// (`<|channel>...<channel|>`) before trimming; "assistant" becomes the role "model"; a model message that follows
// an "assistant" message continues its model turn (the template writes no second header; it compares the role as
// given, so after a message given as "model" a new header is written); content given as a list of text parts is
// rendered part by part, as the template does (each part trimmed, or stripped of thinking in a model turn, and
// joined with nothing; a first system message's parts each trimmed and followed by a space); enable_thinking puts
// <|think|> at the top of the system turn, creating one when the conversation has no system message. Some copies
// of the template append an empty thought channel `<|channel>thought\n<channel|>` to the generation prompt when
// thinking is off; chat_options_for() reads the checkpoint's own template and sets
// ChatOptions::empty_thought_channel to match it (dgemma generate --chat, batch --chat and serve use it).
// tests/io/chat_format_test.cpp compares the output with a Jinja rendering
// (tools/reference/make_tokenizer_fixtures.py).
//
// As text, the rendering begins with "<bos>"; encode_chat() therefore encodes it without the tokenizer's own
// post-processor, so the ids start with exactly one <bos> (id 2) whether or not tokenizer.json adds one. Content
// that spells a special token ("<eos>") is encoded as that token, as transformers' apply_chat_template does.
//
// Stop ids: a model turn ends with <turn|>, so generation stops at the ids of generation_config.json, parsed as
// GenerationConfig::stop_token_ids: {1 <eos>, 106 <turn|>, 50 <|tool_response>} for Gemma 4 (JAX end_tokens).
// chat_stop_ids() returns them after checking that the tokenizer knows each one.
#pragma once

#include <sys/stat.h>

#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <diffusion_gemma/core/status.hpp>
#include <diffusion_gemma/io/json_file.hpp>
#include <diffusion_gemma/io/tokenizer.hpp>
#include <diffusion_gemma/io/tokenizer_text.hpp>
#include <diffusion_gemma/io/utf8.hpp>
#include <diffusion_gemma/model/config.hpp>

namespace diffusion_gemma::io {

struct ChatMessage {
  ChatMessage() = default;
  ChatMessage(std::string role_, std::string content_) : role(std::move(role_)), content(std::move(content_)) {}
  ChatMessage(std::string role_, std::string content_, std::vector<std::string> text_parts_)
      : role(std::move(role_)), content(std::move(content_)), text_parts(std::move(text_parts_)) {}

  std::string role;  // "system" / "developer" (as the first message), "user", "assistant" or "model"
  std::string content;
  // OpenAI's content as a list of text parts; when not empty it replaces `content`. Kept apart because the
  // template renders each part on its own: joining them first would trim and tokenize differently.
  std::vector<std::string> text_parts;
};

struct ChatOptions {
  bool add_generation_prompt = true;
  bool enable_thinking = false;
  bool empty_thought_channel = false;  // see the header comment
  std::string bos_token = "<bos>";
};

// The template's strip_thinking: drops every `<|channel>...` up to the next `<channel|>` (and any stray
// `<channel|>`), then trims.
inline std::string strip_thinking(std::string_view text) {
  std::string repaired;  // invalid UTF-8 becomes U+FFFD first, as Tokenizer::encode would make it
  if (!is_valid_utf8(text)) text = repaired = tokenizer_detail::replace_invalid_utf8(text);
  constexpr std::string_view kOpen = "<|channel>", kClose = "<channel|>";
  std::string out;
  std::size_t pos = 0;
  for (;;) {
    const std::size_t close = text.find(kClose, pos);
    const std::string_view part =
        text.substr(pos, close == std::string_view::npos ? std::string_view::npos : close - pos);
    out.append(part.substr(0, part.find(kOpen)));
    if (close == std::string_view::npos) break;
    pos = close + kClose.size();
  }
  return std::string(tokenizer_detail::python_strip(out));
}

namespace chat_detail {

// The template's rendering of one message's content: `trim` for a system or user turn, `strip_thinking` for a
// model turn; a list of parts is rendered part by part, a first system message's parts followed by a space.
inline std::string render_content(const ChatMessage& m, bool model_turn, bool first_system) {
  const auto one = [&](std::string_view text) {
    // Invalid UTF-8 becomes U+FFFD before the trim, as Tokenizer::encode would make it: trimmed
    // as raw bytes, a cut sequence at the end could pass for white space and vanish.
    std::string repaired;
    if (!is_valid_utf8(text)) text = repaired = tokenizer_detail::replace_invalid_utf8(text);
    return model_turn ? strip_thinking(text) : std::string(tokenizer_detail::python_strip(text));
  };
  if (m.text_parts.empty()) return one(m.content);
  std::string out;
  for (const std::string& part : m.text_parts) {
    out += one(part);
    if (first_system) out += ' ';
  }
  return out;
}

}  // namespace chat_detail

inline std::string render_chat(const std::vector<ChatMessage>& messages, const ChatOptions& options = {}) {
  if (messages.empty()) throw_error(StatusCode::kInvalidArgument, "chat: the conversation has no messages");
  const auto is_model = [](const std::string& role) { return role == "assistant" || role == "model"; };
  std::string out = options.bos_token;
  std::size_t first = 0;
  const bool first_is_system = messages[0].role == "system" || messages[0].role == "developer";
  if (options.enable_thinking || first_is_system) {
    out += "<|turn>system\n";
    if (options.enable_thinking) out += "<|think|>\n";
    if (first_is_system) {
      out += chat_detail::render_content(messages[0], /*model_turn=*/false, /*first_system=*/true);
      first = 1;
    }
    out += "<turn|>\n";
  }
  for (std::size_t i = first; i < messages.size(); ++i) {
    const ChatMessage& m = messages[i];
    if (m.role != "system" && m.role != "user" && !is_model(m.role)) {
      throw_error(StatusCode::kInvalidArgument, "chat: message ", i, " has role '", m.role,
                  "' (expected user, assistant or model; system or developer only first)");
    }
    const bool model_turn = is_model(m.role);
    const bool continues_turn = model_turn && i > first && messages[i - 1].role == "assistant";
    if (!continues_turn) out += model_turn ? std::string("<|turn>model\n") : "<|turn>" + m.role + "\n";
    out += chat_detail::render_content(m, model_turn, /*first_system=*/false);
    out += "<turn|>\n";
  }
  if (options.add_generation_prompt) {
    out += "<|turn>model\n";
    if (options.empty_thought_channel && !options.enable_thinking) out += "<|channel>thought\n<channel|>";
  }
  return out;
}

// The chat template a checkpoint ships: `chat_template.jinja`, else tokenizer_config.json's
// `chat_template` (a string, or a list of named templates, of which "default" is the chat one).
// Empty when the checkpoint has neither. A file that exists but cannot be read is an error naming it.
inline std::string checkpoint_chat_template(const std::string& dir) {
  struct stat st {};
  const std::string jinja = dir + "/chat_template.jinja";
  if (::stat(jinja.c_str(), &st) == 0) return read_text_file(jinja);
  const std::string config = dir + "/tokenizer_config.json";
  if (::stat(config.c_str(), &st) != 0) return {};
  const Json root = read_json_file(config);
  if (!root.is_object() || !root.contains("chat_template")) return {};
  const Json& t = root["chat_template"];
  if (t.is_string()) return t.get<std::string>();
  if (t.is_array()) {
    for (const Json& named : t) {
      if (named.is_object() && named.value("name", "") == "default" && named.contains("template") &&
          named["template"].is_string()) {
        return named["template"].get<std::string>();
      }
    }
  }
  return {};
}

// The options that make render_chat() end the generation prompt as the checkpoint's own template
// does: the 26B/31B copies of the Gemma 4 template write an empty thought channel after
// `<|turn>model\n` when thinking is off, the smaller models' copies do not. Either spelling of its
// newline counts: the Jinja source's escape (backslash, n) or a real newline. Without a template
// the defaults stand.
inline ChatOptions chat_options_for(const std::string& dir) {
  ChatOptions o;
  const std::string t = checkpoint_chat_template(dir);
  o.empty_thought_channel = t.find("<|channel>thought\\n<channel|>") != std::string::npos ||
                            t.find("<|channel>thought\n<channel|>") != std::string::npos;
  return o;
}

inline std::vector<int> encode_chat(const Tokenizer& tokenizer, const std::vector<ChatMessage>& messages,
                                    const ChatOptions& options = {}) {
  return tokenizer.encode(render_chat(messages, options), /*add_special_tokens=*/false);
}

inline std::vector<int> chat_stop_ids(const GenerationConfig& generation, const Tokenizer& tokenizer) {
  for (const int id : generation.stop_token_ids) {
    if (!tokenizer.has_id(id)) {
      throw_error(StatusCode::kInvalidArgument, generation.source, ": stop token id ", id, " is not in ",
                  tokenizer.source());
    }
  }
  return generation.stop_token_ids;
}

}  // namespace diffusion_gemma::io
