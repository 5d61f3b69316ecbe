// SPDX-License-Identifier: Apache-2.0
// The Gemma 4 chat format against Jinja renderings (tools/reference/make_tokenizer_fixtures.py) and the spec.
#include <fstream>
#include <string>
#include <vector>

#include <diffusion_gemma/io/chat_format.hpp>
#include <diffusion_gemma/io/config.hpp>

#include "support/catch.hpp"
#include "support/paths.hpp"

using namespace diffusion_gemma;
using Catch::Matchers::Contains;
using io::ChatMessage;
using io::ChatOptions;
using io::Json;

namespace {

const Json& golden() {
  static const Json g = io::read_json_file(dg_test::fixture("tokenizers/golden.json"));
  return g;
}

std::vector<ChatMessage> messages_of(const Json& j) {
  std::vector<ChatMessage> out;
  for (const Json& m : j) {
    ChatMessage msg{m.at("role").get<std::string>(), {}, {}};
    if (m.at("content").is_string()) {
      msg.content = m.at("content").get<std::string>();
    } else {
      for (const Json& part : m.at("content")) msg.text_parts.push_back(part.at("text").get<std::string>());
    }
    out.push_back(std::move(msg));
  }
  return out;
}

ChatOptions options_of(const Json& j) {
  ChatOptions o;
  o.add_generation_prompt = j.at("add_generation_prompt").get<bool>();
  o.enable_thinking = j.at("enable_thinking").get<bool>();
  o.empty_thought_channel = j.at("empty_thought_channel").get<bool>();
  return o;
}

}  // namespace

TEST_CASE("golden: render_chat equals the Jinja rendering, encode_chat the Python ids", "[io][chat]") {
  const Json& chat = golden().at("chat");
  const io::Tokenizer tok =
      io::Tokenizer::from_file(dg_test::fixture("tokenizers/" + chat.at("tokenizer").get<std::string>()));
  REQUIRE(chat.at("cases").size() >= 52);
  for (const Json& c : chat.at("cases")) {
    INFO(c.at("name").get<std::string>() << " " << c.at("options").dump());
    const auto messages = messages_of(c.at("messages"));
    const ChatOptions options = options_of(c.at("options"));
    CHECK(io::render_chat(messages, options) == c.at("text").get<std::string>());
    CHECK(io::encode_chat(tok, messages, options) == c.at("ids").get<std::vector<int>>());
  }
}

TEST_CASE("chat format follows docs/model.md §8.3", "[io][chat]") {
  const std::vector<ChatMessage> conv = {
      {"system", "Be brief."}, {"user", "Hi"}, {"assistant", "Hello."}, {"user", "Bye"}};
  CHECK(io::render_chat(conv) ==
        "<bos><|turn>system\nBe brief.<turn|>\n<|turn>user\nHi<turn|>\n<|turn>model\nHello.<turn|>\n"
        "<|turn>user\nBye<turn|>\n<|turn>model\n");

  ChatOptions thinking;
  thinking.enable_thinking = true;
  CHECK(io::render_chat({{"user", "Hi"}}, thinking) ==
        "<bos><|turn>system\n<|think|>\n<turn|>\n<|turn>user\nHi<turn|>\n<|turn>model\n");
  CHECK(io::render_chat({{"system", "S"}, {"user", "Hi"}}, thinking) ==
        "<bos><|turn>system\n<|think|>\nS<turn|>\n<|turn>user\nHi<turn|>\n<|turn>model\n");

  ChatOptions no_prompt;
  no_prompt.add_generation_prompt = false;
  CHECK(io::render_chat({{"user", "Hi"}, {"model", "Yo"}}, no_prompt) ==
        "<bos><|turn>user\nHi<turn|>\n<|turn>model\nYo<turn|>\n");

  CHECK(io::strip_thinking(" <|channel>thought\nplan<channel|>Answer ") == "Answer");
  CHECK(io::strip_thinking("a<channel|>b") == "ab");
  CHECK(io::strip_thinking("a<|channel>never closed") == "a");
}

TEST_CASE("chat content that is not valid UTF-8 is trimmed as its U+FFFD repair, never past its end", "[io][chat]") {
  // "rules" and a 3-byte sequence cut after 2 bytes: trimmed as bytes, the cut sequence read a byte
  // past the string (U+2000, white space) and vanished; a lone 4-byte lead at the end read 3 more.
  const std::string cut = std::string("rules") + "\xe2\x80";
  const std::string replacement = "\xef\xbf\xbd";
  CHECK(io::render_chat({{"system", cut}, {"user", "hi"}}) ==
        io::render_chat({{"system", "rules" + replacement}, {"user", "hi"}}));
  CHECK(io::render_chat({{"user", std::string(24, 'a') + "\xf0"}}) ==
        "<bos><|turn>user\n" + std::string(24, 'a') + replacement + "<turn|>\n<|turn>model\n");
  CHECK(io::render_chat({{"user", "\x80 x \xc3"}}) == io::render_chat({{"user", replacement + " x " + replacement}}));
  CHECK(io::strip_thinking("answer \xe2\x80") == "answer " + replacement);
}

TEST_CASE("chat ids start with exactly one <bos> whatever the tokenizer's post-processor does", "[io][chat]") {
  for (const char* file : {"gemma_bpe_1000.json", "gemma_bpe_4000.json"}) {
    INFO(file);
    const io::Tokenizer tok = io::Tokenizer::from_file(dg_test::fixture(std::string("tokenizers/") + file));
    const std::vector<int> ids = io::encode_chat(tok, {{"user", "Hello"}});
    REQUIRE(ids.size() > 4);
    CHECK(ids[0] == 2);
    CHECK(ids[1] == 105);
    CHECK(ids[2] != 2);
    CHECK(ids.back() != 106);
    CHECK(tok.decode(ids, false) == "<bos><|turn>user\nHello<turn|>\n<|turn>model\n");
  }
}

TEST_CASE("chat rejects conversations the template cannot express", "[io][chat]") {
  CHECK_THROWS_WITH(io::render_chat({}), Contains("the conversation has no messages"));
  const auto e = [](const std::vector<ChatMessage>& m) {
    try {
      io::render_chat(m);
    } catch (const Error& err) {
      CHECK(err.code() == StatusCode::kInvalidArgument);
      return std::string(err.what());
    }
    return std::string();
  };
  CHECK_THAT(e({{"user", "a"}, {"tool", "b"}}), Contains("message 1 has role 'tool'"));
  CHECK_THAT(e({{"user", "a"}, {"developer", "b"}}), Contains("message 1 has role 'developer'"));
}

TEST_CASE("stop ids come from generation_config.json and must exist in the tokenizer", "[io][chat]") {
  const io::Tokenizer tok = io::Tokenizer::from_file(dg_test::fixture("tokenizers/gemma_bpe_1000.json"));
  GenerationConfig gen =
      io::parse_generation_config(io::Json::parse(R"({"eos_token_id": [1, 106, 50]})"), "generation_config.json");
  CHECK(io::chat_stop_ids(gen, tok) == std::vector<int>{1, 106, 50});
  CHECK(tok.id_to_token(106) == "<turn|>");
  CHECK(tok.id_to_token(50) == "<|tool_response>");
  gen.stop_token_ids.push_back(5000);
  CHECK_THROWS_WITH(io::chat_stop_ids(gen, tok), Contains("generation_config.json: stop token id 5000 is not in"));
}

TEST_CASE("the generation prompt ends as the checkpoint's own chat template ends it", "[io][chat]") {
  const auto dir_with = [](const std::string& name, const std::string& file, const std::string& text) {
    const std::string d = dg_test::temp_dir("chat_template_" + name);
    if (!file.empty()) {
      std::ofstream(d + "/" + file) << text;
    }
    return d;
  };
  // The 26B/31B copies of the template write the empty thought channel when thinking is off, in the
  // Jinja source with an escaped newline.
  const std::string with_block =
      "{%- if add_generation_prompt -%}{{- '<|turn>model\\n' -}}{%- if not enable_thinking -%}"
      "{{- '<|channel>thought\\n<channel|>' -}}{%- endif -%}{%- endif -%}";
  const std::string without_block = "{%- if add_generation_prompt -%}{{- '<|turn>model\\n' -}}{%- endif -%}";
  const Json as_string = Json{{"chat_template", with_block}};
  const Json as_list = Json{{"chat_template", Json::array({Json{{"name", "tool_use"}, {"template", without_block}},
                                                           Json{{"name", "default"}, {"template", with_block}}})}};

  CHECK_FALSE(io::chat_options_for(dir_with("none", "", "")).empty_thought_channel);
  CHECK(io::chat_options_for(dir_with("jinja", "chat_template.jinja", with_block)).empty_thought_channel);
  CHECK_FALSE(io::chat_options_for(dir_with("jinja_plain", "chat_template.jinja", without_block)).empty_thought_channel);
  CHECK(io::chat_options_for(dir_with("config", "tokenizer_config.json", as_string.dump())).empty_thought_channel);
  CHECK(io::chat_options_for(dir_with("list", "tokenizer_config.json", as_list.dump())).empty_thought_channel);
  CHECK_FALSE(io::chat_options_for(dir_with("no_key", "tokenizer_config.json", R"({"bos_token": "<bos>"})"))
                  .empty_thought_channel);
  CHECK_THROWS_WITH(io::chat_options_for(dir_with("broken", "tokenizer_config.json", "{\"chat_template\": ")),
                    Contains("tokenizer_config.json") && Contains("not valid JSON"));

  const std::string d = dir_with("render", "chat_template.jinja", with_block);
  const std::string text = io::render_chat({{"user", "Hi"}}, io::chat_options_for(d));
  CHECK(text == "<bos><|turn>user\nHi<turn|>\n<|turn>model\n<|channel>thought\n<channel|>");
}
