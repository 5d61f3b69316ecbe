// SPDX-License-Identifier: Apache-2.0
// The pure parts of `dgemma serve`: request checks (serve/api.hpp) and the text deltas of a stream
// (serve/text_stream.hpp), llama.cpp's /completion (serve/llama_api.hpp), with a byte-level fake tokenizer so that UTF-8 can split anywhere.
#include "support/catch.hpp"

#include <string>
#include <vector>

#include <diffusion_gemma/io/tokenizer.hpp>

#include "serve/api.hpp"
#include "serve/llama_api.hpp"
#include "serve/metrics.hpp"
#include "serve/text_stream.hpp"
#include "support/paths.hpp"

using namespace dgemma::serve;

namespace {

// id = one byte; decoding replaces each byte of an incomplete or invalid sequence by U+FFFD, as a
// byte-fallback tokenizer does.
std::string fake_decode(const std::vector<std::int32_t>& ids) {
  std::string bytes;
  for (auto id : ids) bytes.push_back(static_cast<char>(id));
  std::string out;
  for (std::size_t i = 0; i < bytes.size();) {
    const unsigned char c = static_cast<unsigned char>(bytes[i]);
    const std::size_t need = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
    bool ok = need > 0 && i + need <= bytes.size();
    for (std::size_t k = 1; ok && k < need; ++k) ok = (static_cast<unsigned char>(bytes[i + k]) & 0xc0) == 0x80;
    if (ok) {
      out.append(bytes, i, need);
      i += need;
    } else {
      out += "\xEF\xBF\xBD";
      ++i;
    }
  }
  return out;
}

std::vector<std::int32_t> ids_of(const std::string& s) {
  std::vector<std::int32_t> ids;
  for (unsigned char c : s) ids.push_back(c);
  return ids;
}

// Feeds `text` in canvases of `canvas` bytes; returns the concatenated deltas and the finish reason.
std::pair<std::string, std::string> stream(const std::string& text, int canvas, std::vector<std::string> stops,
                                           int max_tokens, bool ends_on_stop_id, std::vector<std::string>* deltas = nullptr) {
  TextAssembler a(fake_decode, std::move(stops), max_tokens);
  const auto ids = ids_of(text);
  std::string out, reason;
  for (std::size_t at = 0; at < ids.size(); at += static_cast<std::size_t>(canvas)) {
    const int n = static_cast<int>(std::min<std::size_t>(static_cast<std::size_t>(canvas), ids.size() - at));
    const bool last = at + static_cast<std::size_t>(n) >= ids.size();
    const auto d = a.add(ids.data() + at, n, last && ends_on_stop_id, last);
    if (deltas) deltas->push_back(d.text);
    out += d.text;
    if (d.finished) {
      reason = d.finish_reason;
      break;
    }
  }
  return {out, reason};
}

ApiLimits limits(bool strict = false) {
  ApiLimits l;
  l.model_id = "m";
  l.default_max_tokens = 48;
  l.max_tokens_limit = 512;
  l.strict = strict;
  return l;
}

int status_of(const std::string& body, std::string* param = nullptr, bool chat = true, bool strict = false) {
  try {
    chat ? parse_chat_request(body, limits(strict)) : parse_completion_request(body, limits(strict));
  } catch (const ApiError& e) {
    if (param) *param = e.param();
    return e.status();
  }
  return 200;
}

std::vector<std::string> ignored_of(const std::string& body) { return parse_chat_request(body, limits()).ignored; }

}  // namespace

TEST_CASE("serve: a UTF-8 character split across canvases is held back, never sent as U+FFFD", "[serve]") {
  const std::string text = "caf\xC3\xA9 \xE2\x82\xAC 1 \xF0\x9F\x98\x80!";  // é, €, 😀
  for (int canvas = 1; canvas <= 6; ++canvas) {
    std::vector<std::string> deltas;
    const auto [out, reason] = stream(text, canvas, {}, 1000, true, &deltas);
    CHECK(out == text);
    CHECK(reason == "stop");
    for (const auto& d : deltas) CHECK(d.find("\xEF\xBF\xBD") == std::string::npos);
  }
}

TEST_CASE("serve: a run of byte tokens is held back until it ends: the answer does not depend on the canvases",
          "[serve]") {
  // A fuzzer finding: "\t" then 0xFF decode, as one run, to two U+FFFD, the tab included; a stream
  // that had sent the tab could not take it back, and its answer differed from the whole decode.
  const auto tok = diffusion_gemma::io::Tokenizer::from_file(dg_test::fixture("tokenizers/gemma_bpe_1000.json"));
  const std::int32_t tab = tok.token_id("<0x09>"), ff = tok.token_id("<0xFF>"), e1 = tok.token_id("<0xC3>"),
                     e2 = tok.token_id("<0xA9>"), a = tok.token_id("a"), special = tok.token_id("<eos>");
  const auto decode = [&](const std::vector<std::int32_t>& ids) { return tok.decode(std::vector<int>(ids.begin(), ids.end())); };
  const auto pending = [&](std::int32_t id) { return tok.decodes_with_next(id); };
  CHECK(pending(tab));
  CHECK(pending(special));  // skipped in decoding, so it does not end a run
  CHECK_FALSE(pending(a));
  for (const std::vector<std::int32_t>& ids : {std::vector<std::int32_t>{a, tab, ff, a, a},
                                               std::vector<std::int32_t>{tab, special, ff, a},
                                               std::vector<std::int32_t>{a, e1, e2, tab, a, tab}}) {
    const std::string whole = decode(ids);
    for (int canvas = 1; canvas <= 3; ++canvas) {
      TextAssembler s(decode, {}, 100, pending);
      std::string out;
      for (std::size_t at = 0; at < ids.size(); at += static_cast<std::size_t>(canvas)) {
        const int n = static_cast<int>(std::min<std::size_t>(static_cast<std::size_t>(canvas), ids.size() - at));
        out += s.add(ids.data() + at, n, false, at + static_cast<std::size_t>(n) >= ids.size()).text;
      }
      CHECK(out == whole);
    }
  }
}

TEST_CASE("serve: stop sequences cut the text, also across canvases", "[serve]") {
  for (int canvas = 1; canvas <= 7; ++canvas) {
    std::vector<std::string> deltas;
    const auto [out, reason] = stream("alpha beta END gamma", canvas, {"END", "zzz"}, 1000, false, &deltas);
    CHECK(out == "alpha beta ");
    CHECK(reason == "stop");
    for (const auto& d : deltas) CHECK(d.find('E') == std::string::npos);
  }
  // A held-back prefix that turns out not to be a stop is sent later.
  CHECK(stream("ab EN cd", 3, {"END"}, 1000, false).first == "ab EN cd");
  // The earliest of two stop sequences wins.
  CHECK(stream("one two three", 4, {"three", "two"}, 1000, false).first == "one ");
}

TEST_CASE("serve: max_tokens is a hard limit although canvases are whole", "[serve]") {
  auto [out, reason] = stream("0123456789abcdef", 4, {}, 6, false);
  CHECK(out == "012345");
  CHECK(reason == "length");
  // Exactly max_tokens, ending on a stop id: "stop".
  std::tie(out, reason) = stream("0123", 4, {}, 4, true);
  CHECK(out == "0123");
  CHECK(reason == "stop");
  // All canvases without a stop id: "length".
  std::tie(out, reason) = stream("01234567", 4, {}, 100, false);
  CHECK(reason == "length");
}

TEST_CASE("serve: request checks name the field at fault", "[serve]") {
  std::string p;
  CHECK(status_of(R"({"model":"m","messages":[{"role":"user","content":"hi"}]})") == 200);
  CHECK(status_of(R"({"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"hi"}]}]})") == 200);
  // Text parts stay apart: the chat template trims each one and joins them with nothing.
  const GenerationRequest parts = parse_chat_request(
      R"({"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"Hello "},{"type":"text","text":" you"}]}]})",
      limits());
  REQUIRE(parts.messages.size() == 1);
  CHECK(parts.messages[0].text_parts == std::vector<std::string>{"Hello ", " you"});
  CHECK(status_of(R"({"model":"m","messages":[]})", &p) == 400);
  CHECK(p == "messages");
  // A user or system turn needs its content; only an assistant turn may come without.
  CHECK(status_of(R"({"model":"m","messages":[{"role":"user","content":null}]})", &p) == 400);
  CHECK(p == "messages[0].content");
  CHECK(status_of(R"({"model":"m","messages":[{"role":"system","content":"s"},{"role":"user"}]})", &p) == 400);
  CHECK(p == "messages[1].content");
  CHECK(status_of(R"({"model":"m","messages":[{"role":"user","content":"a"},{"role":"assistant","content":null},
                     {"role":"user","content":"b"}]})") == 200);
  // A content part's other keys are named as ignored, or refused under --strict.
  const std::string part = R"({"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"x",
                              "cache_control":{"type":"ephemeral"}}]}]})";
  CHECK(ignored_of(part) == std::vector<std::string>{"messages[0].content[0].cache_control"});
  CHECK(status_of(part, &p, true, true) == 400);
  CHECK(p == "messages[0].content[0].cache_control");
  CHECK(status_of(R"({"model":"x","messages":[{"role":"user","content":"hi"}]})", &p) == 404);
  CHECK(p == "model");
  CHECK(status_of(R"({"messages":[{"role":"user","content":"hi"}]})", &p) == 400);
  CHECK(p == "model");
  CHECK(status_of(R"({"model":"m","messages":[{"role":"tool","content":"hi"}]})", &p) == 400);
  CHECK(p == "messages[0].role");
  // A system message may come anywhere, as the chat format renders it; a later developer message
  // is a system message by OpenAI's other name (the format has no developer turn).
  const GenerationRequest later = parse_chat_request(
      R"({"model":"m","messages":[{"role":"developer","content":"d"},{"role":"user","content":"a"},
          {"role":"system","content":"b"},{"role":"developer","content":"c"}]})",
      limits());
  REQUIRE(later.messages.size() == 4);
  CHECK(later.messages[0].role == "developer");
  CHECK(later.messages[2].role == "system");
  CHECK(later.messages[3].role == "system");
  // vLLM's rendering fields: another rendering than a new model turn is refused, never ignored.
  CHECK(status_of(R"({"model":"m","messages":[{"role":"user","content":"a"},{"role":"assistant","content":"b"}],
                     "continue_final_message":true,"add_generation_prompt":false})", &p) == 400);
  CHECK(p == "add_generation_prompt");
  CHECK(status_of(R"({"model":"m","messages":[{"role":"user","content":"a"}],"continue_final_message":true})", &p) == 400);
  CHECK(p == "continue_final_message");
  CHECK(status_of(R"({"model":"m","messages":[{"role":"user","content":"a"}],"continue_final_message":false,
                     "add_generation_prompt":true})") == 200);
  const std::string thinking = R"({"model":"m","messages":[{"role":"user","content":"a"}],
                                   "chat_template_kwargs":{"enable_thinking":true,"other":1}})";
  CHECK(parse_chat_request(thinking, limits()).enable_thinking);
  CHECK(ignored_of(thinking) == std::vector<std::string>{"chat_template_kwargs.other"});
  CHECK(status_of(thinking, &p, true, true) == 400);
  CHECK(p == "chat_template_kwargs.other");
  CHECK_FALSE(parse_chat_request(R"({"model":"m","messages":[{"role":"user","content":"a"}]})", limits()).enable_thinking);
  CHECK(status_of(R"({"model":"m","messages":[{"role":"user","content":"a"}],"chat_template_kwargs":{"enable_thinking":1}})",
                  &p) == 400);
  CHECK(p == "chat_template_kwargs.enable_thinking");
  CHECK(status_of(R"({"model":"m","messages":[{"role":"user","content":"hi"}],"max_tokens":10,"max_completion_tokens":11})",
                  &p) == 400);
  CHECK(p == "max_completion_tokens");
  CHECK(status_of(R"({"model":"m","messages":[{"role":"user","content":"hi"}],"top_p":0.5})", &p, true, true) == 400);
  CHECK(p == "top_p");
  CHECK(status_of(R"({"model":"m","messages":[{"role":"user","content":"hi"}],"temperature":1,"top_p":1,"n":1})") == 200);
  // OpenAI's seed is a signed 64-bit integer: a negative one keys the draws by its bits (-1 alone
  // asks for a random seed, as llama.cpp).
  CHECK(parse_chat_request(R"({"model":"m","messages":[{"role":"user","content":"hi"}],"seed":-2})", limits()).seed ==
        18446744073709551614ull);
  const GenerationRequest lowest = parse_chat_request(
      R"({"model":"m","messages":[{"role":"user","content":"hi"}],"seed":-9223372036854775808})", limits());
  CHECK(lowest.seed == 9223372036854775808ull);
  CHECK_FALSE(lowest.random_seed);
  CHECK(status_of(R"({"model":"m","messages":[{"role":"user","content":"hi"}],"seed":"3"})", &p) == 400);
  CHECK(p == "seed");
  CHECK(status_of(R"({"model":"m","messages":[{"role":"user","content":"hi"}],"seed":18446744073709551616})", &p) == 400);
  CHECK(p == "seed");
  CHECK(parse_chat_request(R"({"model":"m","messages":[{"role":"user","content":"hi"}],"seed":-1})", limits()).random_seed);
  // Numbers beyond a double are a client's JSON error, not a server failure.
  CHECK(status_of(R"({"model":"m","messages":[{"role":"user","content":"hi"}],"max_tokens":1e400})", &p) == 400);
  CHECK(status_of(R"({"model":"m","messages":[{"role":"user","content":"hi"}],"n":2})", &p) == 200);
  CHECK(status_of(R"({"model":"m","messages":[{"role":"user","content":"hi"}],"n":65})", &p) == 400);
  CHECK(p == "n");
  CHECK(status_of(R"({"model":"m","messages":[{"role":"user","content":"hi"}],"n":1.5})", &p) == 400);
  CHECK(p == "n");
  CHECK(status_of(R"({"model":"m","messages":[{"role":"user","content":"hi"}],"best_of":2})", &p) == 400);
  CHECK(p == "best_of");
  CHECK(status_of(R"({"model":"m","messages":[{"role":"user","content":"hi"}],"response_format":{"type":"json_object"}})",
                  &p) == 400);
  CHECK(p == "response_format");
  CHECK(status_of(R"({"model":"m","messages":[{"role":"user","content":"hi"}],"stop":["a","b","c","d","e"]})", &p) == 400);
  CHECK(p == "stop");
  CHECK(status_of(R"({"model":"m","messages":[{"role":"user","content":"hi"}],"dgemma":{"stream_drafts":true}})", &p) == 400);
  CHECK(p == "dgemma.stream_drafts");
  CHECK(status_of(R"({"model":"m","messages":[{"role":"user","content":"hi"}],"dgemma":{"max_denoising_steps":0}})", &p) ==
        400);
  CHECK(p == "dgemma.max_denoising_steps");
  CHECK(status_of(R"({"model":"m","prompt":[2,-1]})", &p, false) == 400);
  CHECK(p == "prompt[1]");
  const auto ids = parse_completion_request(R"({"model":"m","prompt":[[2,17,5]]})", limits());
  REQUIRE(ids.prompts.size() == 1);
  CHECK(ids.prompts[0].is_ids);
  CHECK(ids.prompts[0].ids == std::vector<std::int64_t>{2, 17, 5});
  // A list of prompts, text and ids mixed: one choice each, in order; each is checked by position.
  const auto batch = parse_completion_request(R"({"model":"m","prompt":["a", [2,9], "b"]})", limits());
  REQUIRE(batch.prompts.size() == 3);
  CHECK((batch.prompts[0].text == "a" && !batch.prompts[0].is_ids && batch.prompts[1].is_ids && batch.prompts[2].text == "b"));
  CHECK(status_of(R"({"model":"m","prompt":["a",""]})", &p, false) == 400);
  CHECK(p == "prompt[1]");
  CHECK(status_of(R"({"model":"m","prompt":["a",[2,-3]]})", &p, false) == 400);
  CHECK(p == "prompt[1][1]");
  CHECK(status_of(R"({"model":"m","prompt":["a",7]})", &p, false) == 400);
  CHECK(p == "prompt[1]");
  CHECK(status_of(R"({"model":"m","prompt":[]})", &p, false) == 400);
  CHECK(p == "prompt");
  std::string many = R"({"model":"m","prompt":[)";
  for (int i = 0; i < 65; ++i) many += std::string(i ? "," : "") + "\"p\"";
  CHECK(status_of(many + "]}", &p, false) == 400);
  CHECK(p == "prompt");
  CHECK(status_of(R"({"model":"m","prompt":"x","echo":true})", &p, false) == 400);
  CHECK(p == "echo");

  const auto r = parse_chat_request(
      R"({"model":"m","messages":[{"role":"user","content":"hi"}],"max_completion_tokens":7,"seed":18446744073709551615,
          "stop":"x","stream":true,"dgemma":{"t_min":0.1,"t_max":0.9,"max_denoising_steps":5,"stream_drafts":true}})",
      limits());
  CHECK(r.max_tokens == 7);
  CHECK(r.seed == 18446744073709551615ull);
  CHECK(r.stop == std::vector<std::string>{"x"});
  CHECK(r.stream_drafts);
  CHECK(*r.sampler.max_denoising_steps == 5);
  CHECK(parse_chat_request(R"({"model":"m","messages":[{"role":"user","content":"hi"}]})", limits()).max_tokens == 48);
  CHECK(!parse_chat_request(R"({"model":"m","messages":[{"role":"user","content":"hi"}]})", limits()).max_tokens_given);
  CHECK(r.max_tokens_given);
}

TEST_CASE("serve: an error message states what is wrong with the value given", "[serve]") {
  // The message of a refused /v1/completions (chat false) or chat body, and its param.
  const auto refusal = [](const std::string& body, bool chat, std::string* param) {
    try {
      chat ? parse_chat_request(body, limits()) : parse_completion_request(body, limits());
    } catch (const ApiError& e) {
      *param = e.param();
      return std::string(e.what());
    }
    return std::string("accepted");
  };
  std::string p;
  // An empty list is an array: "must be ... an array (got array)" told the client nothing.
  CHECK(refusal(R"({"model":"m","prompt":[]})", false, &p) == "'prompt' must not be empty");
  CHECK(p == "prompt");
  CHECK(refusal(R"({"model":"m","prompt":[[]]})", false, &p) == "'prompt[0]' must not be empty");
  CHECK(p == "prompt[0]");
  CHECK(refusal(R"({"model":"m","prompt":[[2,5],[]]})", false, &p) == "'prompt[1]' must not be empty");
  CHECK(p == "prompt[1]");
  // Inside a list of prompts a list holds token ids: the element that is not one is named.
  CHECK(refusal(R"({"model":"m","prompt":["a",["b"]]})", false, &p) ==
        "'prompt[1][0]' must be an integer token id (got string)");
  CHECK(p == "prompt[1][0]");
  CHECK(refusal(R"({"model":"m","prompt":[true]})", false, &p) == "'prompt[0]' must be an integer (got boolean)");
  CHECK(p == "prompt[0]");
  CHECK(refusal(R"({"model":"m","prompt":["a",7]})", false, &p) ==
        "'prompt[1]' must be a string or an array of token ids (got integer)");
  // A value above the upper bound is not "must be > 0".
  for (const char* k : {"entropy_bound", "confidence_threshold"}) {
    INFO(k);
    const std::string head = R"({"model":"m","messages":[{"role":"user","content":"hi"}],"dgemma":{")" + std::string(k);
    CHECK(refusal(head + R"(":1e300}})", true, &p) == "'dgemma." + std::string(k) + "' must be in (0, 1e9] (got 1e+300)");
    CHECK(p == "dgemma." + std::string(k));
    CHECK(refusal(head + R"(":0}})", true, &p) == "'dgemma." + std::string(k) + "' must be in (0, 1e9] (got 0)");
    CHECK(refusal(head + R"(":1e9}})", true, &p) == "accepted");
  }
}

TEST_CASE("serve: deeply nested bodies are refused before anything recurses over them", "[serve]") {
  const auto nested = [](std::size_t levels) { return std::string(levels, '[') + std::string(levels, ']'); };
  const std::string chat = R"({"model":"m","messages":[{"role":"user","content":"hi"}])";
  std::string p;
  // 256 levels in all (the body's object and an unknown field's arrays) pass; one more is refused.
  CHECK(status_of(chat + R"(,"x":)" + nested(255) + "}", &p) == 200);
  CHECK(status_of(chat + R"(,"x":)" + nested(256) + "}", &p) == 400);
  // 400000 levels in 800 KB under a field whose error message quotes the value: the printing
  // recursed once per level and overflowed the stack (the server died with SIGSEGV).
  for (const char* key : {"logprobs", "best_of", "temperature"}) {
    INFO(key);
    try {
      parse_completion_request(R"({"model":"m","prompt":"a",")" + std::string(key) + "\":" + nested(400000) + "}", limits());
      CHECK(false);
    } catch (const ApiError& e) {
      CHECK(e.status() == 400);
      CHECK(e.code() == "invalid_json");
      CHECK(std::string(e.what()).find("more than 256 deep") != std::string::npos);
    }
  }
  CHECK_THROWS_AS(parse_tokenize_request(R"({"prompt":"a","x":)" + nested(100000) + "}", limits()), ApiError);
  CHECK_THROWS_AS(parse_llama_completion_request(R"({"prompt":"a","n_probs":)" + nested(100000) + "}", limits()), ApiError);
  // Brackets inside strings, escaped quotes included, are text, not nesting.
  CHECK(status_of(R"({"model":"m","messages":[{"role":"user","content":"\"[)" + std::string(1000, '[') + R"("}]})", &p) == 200);
}

TEST_CASE("serve: what clients send by default is accepted; what cannot be honoured is named, or refused under --strict",
          "[serve]") {
  std::string p;
  // Sampling values this sampler has no counterpart for: ignored and named (vLLM's and llama.cpp's
  // behaviour), with their type and range still checked.
  CHECK(ignored_of(R"({"model":"m","messages":[{"role":"user","content":"hi"}],"temperature":0,"top_p":0.9,"top_k":40,
                      "min_p":0.05,"repetition_penalty":1.1,"presence_penalty":0.5})") ==
        std::vector<std::string>{"min_p", "presence_penalty", "repetition_penalty", "temperature", "top_k", "top_p"});
  CHECK(status_of(R"({"model":"m","messages":[{"role":"user","content":"hi"}],"temperature":3})", &p) == 400);
  CHECK(p == "temperature");
  CHECK(status_of(R"({"model":"m","messages":[{"role":"user","content":"hi"}],"temperature":"hot"})", &p) == 400);
  CHECK(p == "temperature");
  // Neutral values and request bookkeeping are accepted silently.
  CHECK(ignored_of(R"({"model":"m","messages":[{"role":"user","content":"hi"}],"temperature":1,"top_k":-1,"min_p":0,
                      "store":false,"metadata":{},"user":"u","parallel_tool_calls":true,"tool_choice":"auto"})")
            .empty());
  // An unknown field: ignored and named; refused under --strict.
  CHECK(ignored_of(R"({"model":"m","messages":[{"role":"user","content":"hi"}],"max_token":5})") ==
        std::vector<std::string>{"max_token"});
  CHECK(status_of(R"({"model":"m","messages":[{"role":"user","content":"hi"}],"max_token":5})", &p, true, true) == 400);
  CHECK(p == "max_token");
  CHECK(status_of(R"({"model":"m","messages":[{"role":"user","content":"hi"}],"temperature":0.2})", &p, true, true) == 400);
  CHECK(p == "temperature");
  // An assistant message handed back as the openai SDK's model_dump() returns it.
  CHECK(status_of(R"({"model":"m","messages":[{"role":"user","content":"hi"},
      {"role":"assistant","content":"1","refusal":null,"annotations":[],"audio":null,"function_call":null,"tool_calls":null},
      {"role":"user","content":"again"}]})") == 200);
  CHECK(status_of(R"({"model":"m","messages":[{"role":"assistant","content":"1","tool_calls":[{"id":"a"}]}]})", &p) == 400);
  CHECK(p == "messages[0].tool_calls");
  CHECK(status_of(R"({"model":"m","messages":[{"role":"tool","tool_call_id":"a","content":"x"}]})", &p) == 400);
  CHECK(p == "messages[0].role");
}

TEST_CASE("serve: /tokenize and /detokenize bodies in vLLM's and llama.cpp's shapes", "[serve]") {
  const auto tokenize_status = [](const std::string& body, std::string* param = nullptr, bool strict = false) {
    try {
      parse_tokenize_request(body, limits(strict));
    } catch (const ApiError& e) {
      if (param) *param = e.param();
      return e.status();
    }
    return 200;
  };
  // vLLM's "prompt" adds <bos> by default, llama.cpp's "content" does not; either flag overrides.
  CHECK(parse_tokenize_request(R"({"prompt":"hi"})", limits()).add_special);
  CHECK_FALSE(parse_tokenize_request(R"({"content":"hi"})", limits()).add_special);
  CHECK_FALSE(parse_tokenize_request(R"({"prompt":"hi","add_special_tokens":false})", limits()).add_special);
  CHECK(parse_tokenize_request(R"({"content":"hi","add_special":true})", limits()).add_special);
  const TokenizeRequest conv =
      parse_tokenize_request(R"({"model":"m","messages":[{"role":"user","content":"hi"}],"add_special_tokens":true})", limits());
  CHECK(conv.chat);
  REQUIRE(conv.messages.size() == 1);
  CHECK(conv.messages[0].content == "hi");
  CHECK(conv.ignored == std::vector<std::string>{"add_special_tokens"});  // the chat format writes its own <bos>
  CHECK(parse_tokenize_request(R"({"content":"a","with_pieces":true})", limits()).with_pieces);
  CHECK(parse_tokenize_request(R"({"prompt":"a","return_token_strs":true})", limits()).return_token_strs);

  std::string p;
  CHECK(tokenize_status("{}", &p) == 400);
  CHECK(p == "prompt");
  CHECK(tokenize_status(R"({"prompt":"a","messages":[]})", &p) == 400);
  CHECK(p == "messages");
  CHECK(tokenize_status(R"({"prompt":["a"]})", &p) == 400);
  CHECK(p == "prompt");
  CHECK(tokenize_status(R"({"content":"a","with_pieces":"yes"})", &p) == 400);
  CHECK(p == "with_pieces");
  CHECK(tokenize_status(R"({"messages":[{"role":"tool","content":"a"}]})", &p) == 400);
  CHECK(p == "messages[0].role");
  CHECK(tokenize_status(R"({"messages":[{"role":"user","content":"a"}],"add_generation_prompt":false})", &p) == 400);
  CHECK(p == "add_generation_prompt");
  CHECK(parse_tokenize_request(R"({"messages":[{"role":"user","content":"a"}],"chat_template_kwargs":{"enable_thinking":true}})",
                               limits())
            .enable_thinking);
  CHECK(tokenize_status(R"({"content":"a","parse_special":false})", &p) == 400);
  CHECK(p == "parse_special");
  CHECK(tokenize_status(R"({"prompt":"a","model":"x"})", &p) == 404);
  CHECK(p == "model");
  CHECK(tokenize_status("[1]") == 400);
  CHECK(parse_tokenize_request(R"({"prompt":"a","n_probs":3})", limits()).ignored == std::vector<std::string>{"n_probs"});
  CHECK(tokenize_status(R"({"prompt":"a","n_probs":3})", &p, true) == 400);
  CHECK(p == "n_probs");

  CHECK(parse_detokenize_request(R"({"tokens":[2,17,5]})", limits()).tokens == std::vector<std::int64_t>{2, 17, 5});
  CHECK(parse_detokenize_request(R"({"tokens":[]})", limits()).tokens.empty());
  const auto detokenize_param = [](const std::string& body) {
    try {
      parse_detokenize_request(body, limits());
    } catch (const ApiError& e) {
      return e.param();
    }
    return std::string("(accepted)");
  };
  CHECK(detokenize_param("{}") == "tokens");
  CHECK(detokenize_param(R"({"tokens":[1,-1]})") == "tokens[1]");
  CHECK(detokenize_param(R"({"tokens":[1,2.5]})") == "tokens[1]");
  CHECK(detokenize_param(R"({"tokens":[1,4294967296]})") == "tokens[1]");
  CHECK(detokenize_param(R"({"tokens":{"a":1}})") == "tokens");
  CHECK(detokenize_param(R"({"tokens":[1],"model":"x"})") == "model");
}

TEST_CASE("serve: the stop sequence that ended the text is named, and the kept ids are returned", "[serve]") {
  TextAssembler a(fake_decode, {"three", "two"}, 1000);
  const auto ids = ids_of("one two three");
  const auto d = a.add(ids.data(), static_cast<int>(ids.size()), false, true);
  CHECK(d.text == "one ");
  CHECK(a.stopping_word() == "two");  // the earliest match, not the first listed
  CHECK(a.tokens() == ids);           // a stop sequence cuts the text, not the generated ids
  TextAssembler b(fake_decode, {"zz"}, 4);
  const auto e = b.add(ids.data(), static_cast<int>(ids.size()), false, true);
  CHECK(e.text == "one ");
  CHECK(std::string(e.finish_reason) == "length");
  CHECK(b.stopping_word().empty());
  CHECK(b.tokens().size() == 4);
}

TEST_CASE("serve: llama.cpp's /completion bodies", "[serve]") {
  const auto parse = [](const std::string& body, bool strict = false) {
    return parse_llama_completion_request(body, limits(strict));
  };
  const auto param_of = [](const std::string& body, bool strict = false) {
    try {
      parse_llama_completion_request(body, limits(strict));
    } catch (const ApiError& e) {
      return std::to_string(e.status()) + " " + e.param();
    }
    return std::string("(accepted)");
  };
  // A string; no "model" needed; llama.cpp's defaults: a random seed, n_predict -1 (as many as fit).
  const GenerationRequest one = parse(R"({"prompt":"Add: 1 + 2"})");
  CHECK(one.llama);
  CHECK_FALSE(one.chat);
  CHECK(one.random_seed);
  CHECK_FALSE(one.max_tokens_given);
  CHECK_FALSE(one.prompt_list);
  REQUIRE(one.prompts.size() == 1);
  CHECK(one.prompts[0].text == "Add: 1 + 2");
  CHECK(parse(R"({"prompt":"a","n_predict":-1})").max_tokens_given == false);
  const GenerationRequest fixed = parse(R"({"prompt":"a","n_predict":12,"seed":7,"stop":["x","y"],"stream":true})");
  CHECK(fixed.max_tokens == 12);
  CHECK(fixed.max_tokens_given);
  CHECK(fixed.seed == 7);
  CHECK_FALSE(fixed.random_seed);
  CHECK(fixed.stop == std::vector<std::string>{"x", "y"});
  CHECK(fixed.stream);
  CHECK(parse(R"({"prompt":"a","max_tokens":5})").max_tokens == 5);  // OpenAI's name, as llama.cpp reads it
  CHECK(parse(R"({"prompt":"a","n_predict":0})").max_tokens == 0);    // prompt only: answered without tokens

  // Token ids; ids and strings mixed (one prompt, run in order); a list of prompts.
  const GenerationRequest ids = parse(R"({"prompt":[2,17,5]})");
  REQUIRE(ids.prompts.size() == 1);
  CHECK(ids.prompts[0].is_ids);
  CHECK(ids.prompts[0].ids == std::vector<std::int64_t>{2, 17, 5});
  const GenerationRequest mixed = parse(R"({"prompt":[2,17,"Add",5,6]})");
  REQUIRE(mixed.prompts.size() == 1);
  CHECK_FALSE(mixed.prompts[0].is_ids);
  REQUIRE(mixed.prompts[0].parts.size() == 3);
  CHECK(mixed.prompts[0].parts[0].ids == std::vector<std::int64_t>{2, 17});
  CHECK(mixed.prompts[0].parts[1].text == "Add");
  CHECK(mixed.prompts[0].parts[2].ids == std::vector<std::int64_t>{5, 6});
  const GenerationRequest list = parse(R"({"prompt":["Add: 1 + 2",[2,17],["Sort",9]]})");
  CHECK(list.prompt_list);
  REQUIRE(list.prompts.size() == 3);
  CHECK(list.prompts[0].text == "Add: 1 + 2");
  CHECK(list.prompts[1].is_ids);
  CHECK(list.prompts[2].parts.size() == 2);

  // What llama.cpp's clients send by default is accepted: non-neutral sampling named, inert fields silent.
  const GenerationRequest webui = parse(
      R"({"prompt":"a","temperature":0.8,"top_k":40,"top_p":0.95,"min_p":0.05,"repeat_penalty":1.1,"repeat_last_n":64,
          "cache_prompt":true,"samplers":["top_k","temperature"],"n_probs":0,"typical_p":1,"dry_multiplier":0,
          "timings_per_token":false,"id_slot":-1,"n_keep":0,"grammar":"","image_data":[],"logit_bias":[]})");
  CHECK(webui.ignored == std::vector<std::string>{"min_p", "repeat_penalty", "temperature", "top_k", "top_p"});
  CHECK(param_of(R"({"prompt":"a","temperature":0.8})", true) == "400 temperature");
  CHECK(param_of(R"({"prompt":"a","cache_prompt":true,"temperature":1})", true) == "(accepted)");
  CHECK(parse(R"({"prompt":"a","mystery":1})").ignored == std::vector<std::string>{"mystery"});
  CHECK(param_of(R"({"prompt":"a","mystery":1})", true) == "400 mystery");
  const GenerationRequest fields = parse(R"({"prompt":"a","return_tokens":true,"response_fields":["content","timings/predicted_n"]})");
  CHECK(fields.return_tokens);
  CHECK(fields.response_fields == std::vector<std::string>{"content", "timings/predicted_n"});

  // Each refusal names the field at fault.
  CHECK(param_of("{}") == "400 prompt");
  CHECK(param_of(R"({"prompt":""})") == "400 prompt");
  CHECK(param_of(R"({"prompt":[]})") == "400 prompt");
  CHECK(param_of(R"({"prompt":[1,[2]]})") == "400 prompt[1]");
  CHECK(param_of(R"({"prompt":[1,-2]})") == "400 prompt[1]");
  CHECK(param_of(R"({"prompt":["a",[]]})") == "400 prompt[1]");
  CHECK(param_of(R"({"prompt":{"a":1}})") == "400 prompt");
  CHECK(param_of(R"({"prompt":"a","n_predict":-2})") == "400 n_predict");
  // n_predict wins over max_tokens, -1 included, as llama.cpp reads them; the other is named as ignored.
  const GenerationRequest both = parse(R"({"prompt":"a","n_predict":4,"max_tokens":5})");
  CHECK(both.max_tokens == 4);
  CHECK(both.ignored == std::vector<std::string>{"max_tokens"});
  CHECK_FALSE(parse(R"({"prompt":"a","n_predict":-1,"max_tokens":16})").max_tokens_given);
  CHECK(param_of(R"({"prompt":"a","n_predict":4,"max_tokens":"5"})") == "400 max_tokens");
  CHECK(param_of(R"({"prompt":"a","seed":1.5})") == "400 seed");
  CHECK(param_of(R"({"prompt":"a","seed":"1"})") == "400 seed");
  CHECK(param_of(R"({"prompt":"a","n_probs":5})") == "400 n_probs");
  CHECK(param_of(R"({"prompt":"a","grammar":"root ::= \"x\""})") == "400 grammar");
  CHECK(param_of(R"({"prompt":"a","json_schema":{}})") == "400 json_schema");
  CHECK(param_of(R"({"prompt":"a","image_data":[{"data":"","id":1}]})") == "400 image_data");
  CHECK(param_of(R"({"prompt":"a","stop":"x","stream":"yes"})") == "400 stream");
  CHECK(param_of(R"({"prompt":"a","model":"other"})") == "404 model");
  CHECK(param_of(R"({"prompt":"a","response_fields":"content"})") == "400 response_fields");
  CHECK(param_of(R"({"prompt":"a","dgemma":{"stream_drafts":true}})") == "400 dgemma.stream_drafts");
  CHECK(param_of(R"({"prompt":"a","top_k":"40"})") == "400 top_k");
  std::string many = R"({"prompt":"a","stop":[)";
  for (int i = 0; i < 17; ++i) many += std::string(i ? "," : "") + "\"s" + std::to_string(i) + "\"";
  CHECK(param_of(many + "]}") == "400 stop");  // llama.cpp has no limit; 16 here
}

TEST_CASE("serve: llama.cpp's response objects and response_fields", "[serve]") {
  LlamaResult r;
  r.index = 1;
  r.content = "802\n";
  r.tokens = {7, 8};
  r.tokens_predicted = 2;
  r.tokens_evaluated = 10;
  r.stop_type = "eos";
  r.prompt_ms = 20.0;
  r.predicted_ms = 4.0;
  const json settings{{"n_predict", 16}, {"seed", 3}};
  const json whole = llama_final(r, settings, "m", false);
  CHECK(whole["content"] == "802\n");
  CHECK(whole["tokens"] == json({7, 8}));
  CHECK(whole["stop"] == true);
  CHECK(whole["has_new_line"] == true);
  CHECK(whole["timings"]["predicted_per_second"] == 500.0);
  CHECK(whole["timings"]["prompt_per_token_ms"] == 2.0);
  // In a stream, the final object carries no text: it came in the partial objects.
  const json last = llama_final(r, settings, "m", true);
  CHECK(last["content"] == "");
  CHECK(last["tokens"].empty());
  CHECK(last["stop_type"] == "eos");
  const json only = project_fields(whole, {"content", "generation_settings/n_predict", "timings/nothing", "absent"});
  // A nested field keeps its whole path as its name, as llama.cpp's json_get_nested_values does.
  CHECK(only == json{{"content", "802\n"}, {"generation_settings/n_predict", 16}});
  CHECK(project_fields(whole, {}) == whole);
  const json part = llama_partial(0, "80", {7}, 1, 10);
  CHECK(part["stop"] == false);
  CHECK(part["content"] == "80");
}

TEST_CASE("serve: a histogram's sum keeps growing past a million", "[serve]") {
  // 25,000 canvases of 48 steps, then one more: the sum must show it (at 6 digits it read
  // 1.2e+06 both times, and rate(_sum) / rate(_count) went wrong).
  dgemma::serve::Histogram h({8, 16, 32, 64});
  for (int i = 0; i < 25000; ++i) h.observe(48);
  h.observe(48);
  std::ostringstream out;
  h.write(out, "steps", "steps per canvas");
  CHECK(out.str().find("steps_sum 1200048\n") != std::string::npos);
  CHECK(out.str().find("steps_count 25001\n") != std::string::npos);
}
