// SPDX-License-Identifier: Apache-2.0
// `dgemma serve`'s HTTP contract (docs/serving.md), against the real program on the bundled
// model, over loopback: answers equal `dgemma generate` for the same seed, streams equal whole
// answers, the extension's drafts stay out of the content, stop sequences, every error case in
// OpenAI's error JSON, the API key, a client hanging up mid-stream, overload (429), metrics, and a
// graceful SIGTERM.
//   dg_serve_tests DGEMMA MODEL_DIR
#include <chrono>
#include <cstdint>
#include <csignal>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include "serve_harness.hpp"

using namespace serve_test;

namespace {

std::string g_dgemma, g_model;
const std::string kModelId = "dg-tiny-tasks";

// `dgemma generate --json` for the same prompt and seed: the reference for the server's answers.
json generate_json(const std::vector<std::string>& args) {
  std::string cmd = g_dgemma + " generate --model " + g_model + " --json --no-view --threads 1";
  for (const auto& a : args) cmd += " '" + a + "'";
  FILE* p = ::popen(cmd.c_str(), "r");
  std::string out;
  char buf[4096];
  std::size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
  ::pclose(p);
  return json::parse(out);
}

// Sends `request` as raw bytes over a new loopback connection and returns the first response
// (what arrived within `seconds`; empty if nothing did): for requests no HTTP client library would send.
std::string raw_response(int port, const std::string& request, int seconds = 3) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<std::uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  std::string out;
  if (fd >= 0 && ::connect(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof addr) == 0 &&
      ::send(fd, request.data(), request.size(), 0) == static_cast<ssize_t>(request.size())) {
    // The head and the body may come in separate segments: read until the body announced by
    // Content-Length is complete, the server closes, or the time is up.
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(seconds);
    for (;;) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
      pollfd p{fd, POLLIN, 0};
      if (left.count() <= 0 || ::poll(&p, 1, static_cast<int>(left.count())) <= 0) break;
      char buf[4096];
      const ssize_t n = ::recv(fd, buf, sizeof buf, 0);
      if (n <= 0) break;
      out.append(buf, static_cast<std::size_t>(n));
      const std::size_t head_end = out.find("\r\n\r\n");
      if (head_end == std::string::npos) continue;
      const std::size_t cl = out.find("Content-Length: ");
      const std::size_t body = cl < head_end ? std::stoul(out.substr(cl + 16)) : 0;
      if (out.size() >= head_end + 4 + body) break;
    }
  }
  if (fd >= 0) ::close(fd);
  return out;
}

void expect_error(const Reply& r, int status, const std::string& param, const std::string& code, const std::string& what) {
  CHECK(r.status == status, what + ": status " + std::to_string(r.status) + " body " + r.body);
  json j;
  try {
    j = json::parse(r.body);
  } catch (...) {
    CHECK(false, what + ": body is not JSON: " + r.body);
    return;
  }
  CHECK(j.contains("error") && j["error"].is_object(), what + ": no error object: " + r.body);
  if (!j.contains("error")) return;
  const json& e = j["error"];
  CHECK(e.contains("message") && e["message"].is_string() && !e["message"].get<std::string>().empty(), what + ": " + r.body);
  CHECK(e.contains("type") && e["type"].is_string(), what + ": " + r.body);
  CHECK(e.contains("param") && e.contains("code"), what + ": " + r.body);
  if (!param.empty()) CHECK(e["param"] == param, what + ": param " + e["param"].dump());
  if (!code.empty()) CHECK(e["code"] == code, what + ": code " + e["code"].dump());
}

std::string chat_body(const std::string& content, const std::string& extra = "") {
  return R"({"model":")" + kModelId + R"(","messages":[{"role":"user","content":")" + content + "\"}]" + extra + "}";
}

void contract(int port) {
  // Discovery.
  auto health = get(port, "/health");
  CHECK(health.status == 200 && json::parse(health.body)["status"] == "ok", health.body);
  auto models = get(port, "/v1/models");
  CHECK(models.status == 200 && json::parse(models.body)["data"][0]["id"] == kModelId, models.body);
  CHECK(json::parse(models.body)["data"][0]["max_model_len"] == 512, models.body);  // max_position_embeddings
  expect_error(get(port, "/v1/models/other"), 404, "model", "model_not_found", "unknown model id");

  // A chat answer equals `dgemma generate --chat` with the same seed.
  const json ref = generate_json({"--chat", "--prompt", "Add: 417 + 385", "--seed", "7"});
  auto chat = post(port, "/v1/chat/completions", chat_body("Add: 417 + 385", R"(,"seed":7)"));
  CHECK(chat.status == 200, chat.body);
  const json c = json::parse(chat.body);
  CHECK(c["object"] == "chat.completion", chat.body);
  CHECK(c["choices"][0]["message"]["role"] == "assistant", chat.body);
  CHECK(c["choices"][0]["message"]["content"] == ref["text"], chat.body + " vs generate " + ref.dump());
  CHECK(c["choices"][0]["finish_reason"] == "stop", chat.body);
  CHECK(c["usage"]["completion_tokens"] == ref["tokens"].size(), chat.body);
  CHECK(c["usage"]["total_tokens"] == c["usage"]["prompt_tokens"].get<int>() + c["usage"]["completion_tokens"].get<int>(),
        chat.body);

  // A completion cut by max_tokens: "length", exactly max_tokens tokens, the prefix of generate's text.
  const json ref2 = generate_json({"--prompt", "Sort ascending: 93 44 60 89 20", "--seed", "3", "--max-new-tokens", "32"});
  const std::string comp_body =
      R"({"model":")" + kModelId + R"(","prompt":"Sort ascending: 93 44 60 89 20","seed":3,"max_tokens":20)";
  auto comp = post(port, "/v1/completions", comp_body + "}");
  CHECK(comp.status == 200, comp.body);
  const json cj = json::parse(comp.body);
  CHECK(cj["object"] == "text_completion", comp.body);
  CHECK(cj["choices"][0]["finish_reason"] == "length", comp.body);
  CHECK(cj["usage"]["completion_tokens"] == 20, comp.body);
  const std::string full = ref2["text"].get<std::string>();
  const std::string text = cj["choices"][0]["text"].get<std::string>();
  CHECK(!text.empty() && full.compare(0, text.size(), text) == 0, "'" + text + "' is not a prefix of '" + full + "'");

  // /tokenize and /detokenize, in vLLM's and llama.cpp's shapes: the ids the generation endpoints run.
  {
    const std::string sort_prompt = "Sort ascending: 93 44 60 89 20";
    auto tok = post(port, "/tokenize", R"({"model":")" + kModelId + R"(","prompt":")" + sort_prompt + "\"}");
    CHECK(tok.status == 200, tok.body);
    const json t = json::parse(tok.body);
    CHECK(t["count"] == t["tokens"].size() && t["max_model_len"] == 512 && t["tokens"][0] == 2, tok.body);
    // Those ids as the prompt: the same completion as the text, with as many prompt tokens.
    auto by_ids = post(port, "/v1/completions", R"({"model":")" + kModelId + R"(","prompt":)" + t["tokens"].dump() +
                                                    R"(,"seed":3,"max_tokens":20})");
    CHECK(by_ids.status == 200 && json::parse(by_ids.body)["choices"][0]["text"] == cj["choices"][0]["text"] &&
              json::parse(by_ids.body)["usage"]["prompt_tokens"] == t["count"] && cj["usage"]["prompt_tokens"] == t["count"],
          by_ids.body + " vs " + comp.body);
    // llama.cpp's "content": no <bos> unless add_special asks for it.
    auto plain = post(port, "/tokenize", R"({"content":")" + sort_prompt + "\"}");
    json rest = t["tokens"];
    rest.erase(rest.begin());
    CHECK(plain.status == 200 && json::parse(plain.body)["tokens"] == rest, plain.body);
    auto special = post(port, "/tokenize", R"({"content":")" + sort_prompt + R"(","add_special":true})");
    CHECK(special.status == 200 && json::parse(special.body)["tokens"] == t["tokens"], special.body);
    auto pieces = post(port, "/tokenize", R"({"content":"Add","with_pieces":true})");
    CHECK(pieces.status == 200 && json::parse(pieces.body)["tokens"][0]["piece"] == "Add", pieces.body);
    // A conversation: as many ids as the chat completion's prompt_tokens.
    auto conv = post(port, "/tokenize", R"({"messages":[{"role":"user","content":"Add: 417 + 385"}]})");
    CHECK(conv.status == 200 && json::parse(conv.body)["count"] == c["usage"]["prompt_tokens"], conv.body);
    // chat_template_kwargs.enable_thinking opens the conversation with the thinking switch's system turn.
    auto think = post(port, "/tokenize",
                      R"({"messages":[{"role":"user","content":"Add: 417 + 385"}],"chat_template_kwargs":{"enable_thinking":true}})");
    auto think_text = post(port, "/detokenize", R"({"tokens":)" + json::parse(think.body)["tokens"].dump() + "}");
    CHECK(think.status == 200 && think_text.status == 200 &&
              json::parse(think_text.body)["prompt"].get<std::string>().rfind("<bos><|turn>system\n<|think|>\n", 0) == 0,
          think_text.body);
    // Back to text, special tokens included, under both dialects' keys.
    auto detok = post(port, "/detokenize", R"({"tokens":)" + t["tokens"].dump() + "}");
    CHECK(detok.status == 200 && json::parse(detok.body)["prompt"] == "<bos>" + sort_prompt &&
              json::parse(detok.body)["content"] == "<bos>" + sort_prompt,
          detok.body);
    expect_error(post(port, "/detokenize", R"({"tokens":[2,17,576]})"), 400, "tokens[2]", "invalid_value",
                 "an id outside the vocabulary");
    expect_error(post(port, "/detokenize", R"({"tokens":"2"})"), 400, "tokens", "invalid_type", "tokens not an array");
    expect_error(post(port, "/tokenize", R"({"prompt":"a","content":"b"})"), 400, "content", "invalid_value",
                 "two forms of input");
    expect_error(post(port, "/tokenize", "{}"), 400, "prompt", "missing_parameter", "no input");
    expect_error(post(port, "/tokenize", R"({"prompt":"a","model":"other"})"), 404, "model", "model_not_found",
                 "another model on /tokenize");
  }

  // llama.cpp's /completion: the text /v1/completions gives for the same prompt and seed, in
  // llama.cpp's flat shape; streamed as partial objects and a final one, without [DONE].
  {
    const std::string q = "Sort ascending: 93 44 60 89 20";
    const json oai = json::parse(post(port, "/v1/completions", R"({"model":")" + kModelId + R"(","prompt":")" + q +
                                                                   R"(","seed":3,"max_tokens":40})")
                                     .body);
    const std::string body = R"({"prompt":")" + q + R"(","seed":3,"n_predict":40,"temperature":0.8,"cache_prompt":true)";
    auto native = post(port, "/completion", body + R"(,"return_tokens":true})");
    CHECK(native.status == 200, native.body);
    const json n = json::parse(native.body);
    CHECK(n["content"] == oai["choices"][0]["text"], native.body + " vs " + oai.dump());
    CHECK(n["stop"] == true && n["index"] == 0, native.body);
    CHECK(n["stop_type"] == (oai["choices"][0]["finish_reason"] == "length" ? "limit" : "eos"), native.body);
    CHECK(n["tokens_predicted"] == oai["usage"]["completion_tokens"], native.body);
    CHECK(n["tokens_evaluated"] == oai["usage"]["prompt_tokens"], native.body);
    CHECK(n["tokens"].size() == n["tokens_predicted"].get<std::size_t>(), native.body);
    CHECK(n["prompt"] == "<bos>" + q && n["generation_settings"]["seed"] == 3 && n["generation_settings"]["n_predict"] == 40,
          native.body);
    CHECK(n["timings"]["predicted_n"] == n["tokens_predicted"] && n["timings"]["predicted_ms"].get<double>() > 0.0, native.body);
    CHECK(header(native, "X-Dgemma-Ignored") == "temperature", header(native, "X-Dgemma-Ignored"));
    auto alias = post(port, "/completions", body + "}");  // llama.cpp's other name for it
    CHECK(alias.status == 200 && json::parse(alias.body)["content"] == n["content"], alias.body);

    auto streamed = post(port, "/completion", body + R"(,"stream":true})");
    CHECK(streamed.status == 200 && !streamed.done, "llama.cpp's stream has no [DONE]: " + streamed.body);
    std::string text;
    int finals = 0, partial_tokens = 0;
    for (const auto& e : streamed.events) {
      CHECK(e.contains("content") && e.contains("stop"), e.dump());
      if (!e.contains("content")) continue;
      text += e["content"].get<std::string>();
      if (e["stop"] == true) {
        ++finals;
        CHECK(e["stop_type"] == n["stop_type"] && e["tokens_predicted"] == n["tokens_predicted"], e.dump());
      } else {
        partial_tokens += static_cast<int>(e["tokens"].size());
      }
    }
    CHECK(text == n["content"], text + " vs " + n["content"].dump());
    CHECK(finals == 1 && !streamed.events.empty() && streamed.events.back()["stop"] == true, streamed.body);
    CHECK(partial_tokens == n["tokens_predicted"], streamed.body);

    // A stop sequence: "word" and the word; a mixed prompt ([<bos>, text] runs as the text does);
    // a list of prompts answers a list; response_fields keeps only the named fields.
    auto word = post(port, "/completion", R"({"prompt":")" + q + R"(","seed":3,"n_predict":40,"stop":[" 60"]})");
    const json w = json::parse(word.body);
    CHECK(w["stop_type"] == "word" && w["stopping_word"] == " 60", word.body);
    CHECK(w["content"] == n["content"].get<std::string>().substr(0, n["content"].get<std::string>().find(" 60")), word.body);
    auto mixed = post(port, "/completion", R"({"prompt":[2,")" + q + R"("],"seed":3,"n_predict":40})");
    CHECK(mixed.status == 200 && json::parse(mixed.body)["content"] == n["content"], mixed.body);
    auto list = post(port, "/completion", R"({"prompt":[")" + q + R"(","Reverse: abc"],"seed":3,"n_predict":40})");
    const json l = json::parse(list.body);
    CHECK(l.is_array() && l.size() == 2 && l[0]["index"] == 0 && l[1]["index"] == 1, list.body);
    CHECK(l.size() == 2 && l[0]["content"] == n["content"], list.body);
    auto fields = post(port, "/completion", R"({"prompt":")" + q +
                                                R"(","seed":3,"n_predict":40,"response_fields":["content","generation_settings/seed"]})");
    CHECK(json::parse(fields.body) == json({{"content", n["content"]}, {"generation_settings/seed", 3}}), fields.body);
    // n_predict 0: the prompt is checked and nothing is generated.
    auto none = post(port, "/completion", R"({"prompt":")" + q + R"(","n_predict":0})");
    const json z = json::parse(none.body);
    CHECK(none.status == 200 && z["content"] == "" && z["tokens_predicted"] == 0 &&
              z["tokens_evaluated"] == oai["usage"]["prompt_tokens"] && z["stop_type"] == "limit",
          none.body);
    // No seed: llama.cpp's default -1, a new seed per request, reported in the header and the settings.
    auto random = post(port, "/completion", R"({"prompt":")" + q + R"(","n_predict":16})");
    // 32 bits, as llama.cpp's: a JavaScript client can send it back exactly.
    CHECK(random.status == 200 && json::parse(random.body)["generation_settings"]["seed"].get<std::uint64_t>() < (1ull << 32),
          random.body);
    CHECK(random.status == 200 && !header(random, "X-Dgemma-Seed").empty() &&
              json::parse(random.body)["generation_settings"]["seed"].dump() == header(random, "X-Dgemma-Seed"),
          random.body);
    expect_error(post(port, "/completion", R"({"prompt":"a","n_probs":3})"), 400, "n_probs", "invalid_value", "n_probs");
    expect_error(post(port, "/completion", R"({"prompt":[2,17,576]})"), 400, "prompt[2]", "invalid_value",
                 "an id outside the vocabulary on /completion");
    expect_error(post(port, "/completion", "{}"), 400, "prompt", "missing_parameter", "/completion without a prompt");
  }

  // Streaming: role first, one chunk per canvas, content equal to the whole answer, usage last, [DONE].
  auto st = post(port, "/v1/chat/completions", chat_body("Add: 417 + 385", R"(,"seed":7,"stream":true,"stream_options":{"include_usage":true})"));
  CHECK(st.status == 200 && st.done, st.body);
  CHECK(!st.events.empty() && st.events[0]["choices"][0]["delta"]["role"] == "assistant", st.body);
  CHECK(stream_text(st) == ref["text"], stream_text(st) + " vs " + ref["text"].dump());
  CHECK(stream_finish(st) == "stop", st.body);
  CHECK(stream_usage(st)["completion_tokens"] == ref["tokens"].size(), st.body);
  CHECK(!st.events.empty() && st.events.back()["choices"].empty(), "include_usage: last chunk has no choices");

  // A longer stream: canvases arrive as separate chunks whose concatenation is the whole answer.
  auto whole = post(port, "/v1/completions", R"({"model":")" + kModelId + R"(","prompt":"Sort ascending: 93 44 60 89 20","seed":3,"max_tokens":48})");
  auto parts = post(port, "/v1/completions", R"({"model":")" + kModelId + R"(","prompt":"Sort ascending: 93 44 60 89 20","seed":3,"max_tokens":48,"stream":true})");
  CHECK(whole.status == 200 && parts.status == 200 && parts.done, parts.body);
  CHECK(stream_text(parts) == json::parse(whole.body)["choices"][0]["text"], parts.body + "\nvs\n" + whole.body);
  int content_chunks = 0;
  for (const auto& e : parts.events) content_chunks += e.contains("dgemma") && e["dgemma"].contains("canvas");
  CHECK(content_chunks == 3, "48 tokens in 16-token canvases: 3 chunks, got " + std::to_string(content_chunks));

  // Drafts (opt-in): in the "dgemma" field of chunks with an empty delta; the content is unchanged.
  auto dr = post(port, "/v1/chat/completions",
                 chat_body("Add: 417 + 385", R"(,"seed":7,"stream":true,"dgemma":{"stream_drafts":true})"));
  int drafts = 0;
  for (const auto& e : dr.events) {
    if (e.contains("dgemma") && e["dgemma"].contains("draft")) {
      ++drafts;
      CHECK(e["choices"][0]["delta"].empty(), "a draft chunk carries content: " + e.dump());
      CHECK(e["dgemma"]["draft"]["tokens"].size() == 16, e.dump());
    }
  }
  CHECK(drafts >= 1, dr.body);
  CHECK(stream_text(dr) == ref["text"], "drafts changed the content: " + stream_text(dr));

  // Stop sequences: cut before the match, finish_reason "stop", streamed and whole alike.
  const std::string stop_body = R"({"model":")" + kModelId + R"(","prompt":"Sort ascending: 93 44 60 89 20","seed":3,"max_tokens":48,"stop":[" 60","zzz"])";
  auto sw = post(port, "/v1/completions", stop_body + "}");
  auto ss = post(port, "/v1/completions", stop_body + R"(,"stream":true})");
  const std::string unstopped = json::parse(whole.body)["choices"][0]["text"].get<std::string>();
  const std::string stopped = json::parse(sw.body)["choices"][0]["text"].get<std::string>();
  CHECK(unstopped.find(" 60") != std::string::npos, "the reference text should contain the stop sequence: " + unstopped);
  CHECK(stopped == unstopped.substr(0, unstopped.find(" 60")), stopped + " vs " + unstopped);
  CHECK(json::parse(sw.body)["choices"][0]["finish_reason"] == "stop", sw.body);
  CHECK(stream_text(ss) == stopped && stream_finish(ss) == "stop", ss.body);

  // A list of prompts (vLLM's and lm-evaluation-harness's batches): one choice per prompt, in order,
  // each the answer that prompt gets alone with the same seed (they run as separate sequences of
  // one batch, and our answers do not depend on the batch); stop and max_tokens apply to each.
  {
    const std::vector<std::string> prompts = {R"("Sort ascending: 93 44 60 89 20")", R"("Reverse: abc")", "[2, 17, 5, 9]",
                                              R"("Add: 417 + 385")"};
    std::string list;
    std::vector<std::string> alone;
    int prompt_tokens = 0, completion_tokens = 0;
    std::vector<int> alone_prompt_tokens;
    for (const auto& q : prompts) {
      list += (list.empty() ? "" : ",") + q;
      const auto one = post(port, "/v1/completions",
                            R"({"model":")" + kModelId + R"(","prompt":)" + q + R"(,"seed":5,"max_tokens":32,"stop":["zz"]})");
      CHECK(one.status == 200, one.body);
      const json j = json::parse(one.body);
      alone.push_back(j["choices"][0]["text"].get<std::string>() + "|" + j["choices"][0]["finish_reason"].get<std::string>());
      prompt_tokens += j["usage"]["prompt_tokens"].get<int>();
      alone_prompt_tokens.push_back(j["usage"]["prompt_tokens"].get<int>());
      completion_tokens += j["usage"]["completion_tokens"].get<int>();
    }
    const std::string body = R"({"model":")" + kModelId + R"(","prompt":[)" + list + R"(],"seed":5,"max_tokens":32,"stop":["zz"])";
    const auto many = post(port, "/v1/completions", body + "}");
    CHECK(many.status == 200, many.body);
    const json m = json::parse(many.body);
    CHECK(m["choices"].size() == prompts.size(), many.body);
    for (std::size_t i = 0; i < prompts.size() && i < m["choices"].size(); ++i) {
      const json& c = m["choices"][i];
      CHECK(c["index"] == i, many.body);
      CHECK(c["text"].get<std::string>() + "|" + c["finish_reason"].get<std::string>() == alone[i],
            "prompt " + std::to_string(i) + " in a list: " + c.dump() + " alone: " + alone[i]);
    }
    CHECK(m["usage"]["prompt_tokens"] == prompt_tokens && m["usage"]["completion_tokens"] == completion_tokens, many.body);
    // Streamed: each chunk names its choice; per choice the pieces add up to its answer, and each
    // choice finishes once; the usage comes once, at the end.
    const auto streamed = post(port, "/v1/completions", body + R"(,"stream":true,"stream_options":{"include_usage":true}})");
    CHECK(streamed.status == 200 && streamed.done, streamed.body);
    std::vector<std::string> texts(prompts.size());
    std::vector<int> finishes(prompts.size(), 0);
    for (const auto& e : streamed.events) {
      if (!e.contains("choices")) continue;
      for (const auto& c : e["choices"]) {
        const std::size_t i = c["index"].get<std::size_t>();
        if (i >= prompts.size()) continue;
        texts[i] += c["text"].get<std::string>();
        if (c["finish_reason"].is_string()) texts[i] += "|" + c["finish_reason"].get<std::string>(), ++finishes[i];
      }
    }
    for (std::size_t i = 0; i < prompts.size(); ++i) {
      CHECK(texts[i] == alone[i] && finishes[i] == 1, "streamed prompt " + std::to_string(i) + ": " + texts[i]);
    }
    CHECK(stream_usage(streamed)["completion_tokens"] == completion_tokens, streamed.body);
    // n samples per prompt, in OpenAI's order (prompt by prompt); sample j uses seed + j, and each
    // prompt counts once in the usage.
    const auto sampled = post(port, "/v1/completions", R"({"model":")" + kModelId + R"(","prompt":[)" + prompts[0] + "," +
                                                           prompts[1] + R"(],"n":2,"seed":5,"max_tokens":32,"stop":["zz"]})");
    const auto seed6 = post(port, "/v1/completions",
                            R"({"model":")" + kModelId + R"(","prompt":)" + prompts[0] + R"(,"seed":6,"max_tokens":32,"stop":["zz"]})");
    CHECK(sampled.status == 200 && seed6.status == 200, sampled.body + seed6.body);
    const json sj = json::parse(sampled.body);
    const auto text_of = [](const json& c) { return c["text"].get<std::string>() + "|" + c["finish_reason"].get<std::string>(); };
    CHECK(sj["choices"].size() == 4, sampled.body);
    if (sj["choices"].size() == 4) {
      CHECK(text_of(sj["choices"][0]) == alone[0] && text_of(sj["choices"][2]) == alone[1], sampled.body);
      CHECK(text_of(sj["choices"][1]) == text_of(json::parse(seed6.body)["choices"][0]), sampled.body + " vs " + seed6.body);
      CHECK(sj["usage"]["prompt_tokens"] == alone_prompt_tokens[0] + alone_prompt_tokens[1], sampled.body);
    }
    // A chat stream with n choices opens each of them with its role chunk, as OpenAI does, so
    // that a client assembling each choice from its chunks finds its role.
    const auto chat_n = post(port, "/v1/chat/completions", chat_body("Add: 1 + 2", R"(,"n":3,"max_tokens":16,"stream":true)"));
    CHECK(chat_n.status == 200 && chat_n.done, chat_n.body);
    std::vector<int> roles(3, 0);
    for (const auto& e : chat_n.events) {
      if (!e.contains("choices")) continue;
      for (const auto& c : e["choices"]) {
        const std::size_t i = c["index"].get<std::size_t>();
        if (i < roles.size() && c["delta"].contains("role")) ++roles[i];
      }
    }
    CHECK((roles == std::vector<int>{1, 1, 1}), "role chunks per choice: " + chat_n.body);
    // One bad prompt refuses the whole request, naming it; nothing runs.
    expect_error(post(port, "/v1/completions", R"({"model":")" + kModelId + R"(","prompt":["ok", [2, 99999]]})"), 400,
                 "prompt[1][1]", "invalid_value", "a token id outside the vocabulary in the second prompt");
  }

  // Errors: OpenAI's error JSON, the field at fault named.
  expect_error(post(port, "/v1/chat/completions", "{\"model\": "), 400, "", "invalid_json", "malformed JSON");
  expect_error(post(port, "/v1/chat/completions", "[1,2]"), 400, "", "invalid_json", "not an object");
  expect_error(post(port, "/v1/chat/completions", chat_body("hi", R"(,"max_tokens":"ten")")), 400, "max_tokens",
               "invalid_type", "wrong type");
  expect_error(post(port, "/v1/chat/completions", R"({"model":")" + kModelId + R"(","messages":"hi"})"), 400, "messages",
               "invalid_type", "messages not an array");
  expect_error(post(port, "/v1/chat/completions", R"({"model":")" + kModelId + R"(","messages":[{"role":"user","content":5}]})"),
               400, "messages[0].content", "invalid_type", "content not a string");
  expect_error(post(port, "/v1/chat/completions", R"({"model":"gpt-4","messages":[{"role":"user","content":"hi"}]})"), 404,
               "model", "model_not_found", "unknown model");
  expect_error(post(port, "/v1/chat/completions", chat_body("hi", R"(,"dgemma":{"t_mn":0.1})")), 400, "dgemma.t_mn",
               "unknown_parameter", "unknown extension field");
  expect_error(post(port, "/v1/chat/completions", chat_body("hi", R"(,"dgemma":{"t_min":0.9,"t_max":0.5})")), 400,
               "dgemma.t_max", "invalid_value", "t_max <= t_min");
  expect_error(post(port, "/v1/chat/completions", chat_body("hi", R"(,"n":0)")), 400, "n", "invalid_value", "n = 0");
  expect_error(post(port, "/v1/completions", R"({"model":")" + kModelId + R"(","prompt":["a","b"],"n":40})"), 400, "n",
               "invalid_value", "2 prompts x n 40 choices");
  // What clients send by default and this sampler has no counterpart for (a temperature, top_p, an
  // unknown field) is accepted without effect, and named; the answer is the one without them.
  auto tempered = post(port, "/v1/chat/completions",
                       chat_body("Add: 417 + 385", R"(,"seed":7,"temperature":0.2,"top_p":0.9,"max_token":5)"));
  CHECK(tempered.status == 200 && json::parse(tempered.body)["choices"][0]["message"]["content"] == ref["text"],
        tempered.body);
  CHECK(header(tempered, "X-Dgemma-Ignored") == "max_token, temperature, top_p", header(tempered, "X-Dgemma-Ignored"));
  CHECK(header(tempered, "X-Dgemma-Seed") == "7", header(tempered, "X-Dgemma-Seed"));
  expect_error(post(port, "/v1/chat/completions", chat_body("hi", R"(,"temperature":5)")), 400, "temperature",
               "invalid_value", "temperature out of OpenAI's range");
  // An assistant turn handed back as the openai SDK's model_dump() writes it.
  auto history = post(port, "/v1/chat/completions",
                      R"({"model":")" + kModelId + R"(","messages":[{"role":"user","content":"Add: 1 + 2"},)" +
                          R"({"role":"assistant","content":"3","refusal":null,"annotations":[],"audio":null,)" +
                          R"("function_call":null,"tool_calls":null},{"role":"user","content":"Add: 417 + 385"}]})");
  CHECK(history.status == 200, history.body);
  expect_error(post(port, "/v1/chat/completions", chat_body("hi", R"(,"max_tokens":1e400)")), 400, "", "invalid_json",
               "a number beyond a double");
  expect_error(post(port, "/v1/chat/completions", chat_body("hi", R"(,"max_tokens":0)")), 400, "max_tokens",
               "invalid_value", "max_tokens 0");
  expect_error(post(port, "/v1/chat/completions", chat_body("hi", R"(,"max_tokens":-3)")), 400, "max_tokens",
               "invalid_value", "max_tokens < 0");
  expect_error(post(port, "/v1/chat/completions", chat_body("hi", R"(,"max_tokens":100000)")), 400, "max_tokens",
               "invalid_value", "max_tokens beyond the positions");
  expect_error(post(port, "/v1/chat/completions", chat_body("hi", R"(,"max_tokens":510)")), 400, "max_tokens",
               "context_length_exceeded", "prompt + max_tokens beyond the positions");
  {
    // OpenAI's and vLLM's rule: prompt + max_tokens up to the context is accepted. Canvases are
    // whole, so a limit whose last canvas would not fit is shortened to the canvases that do.
    auto ids = post(port, "/tokenize", R"({"messages":[{"role":"user","content":"hi"}]})");
    const int prompt = json::parse(ids.body)["count"].get<int>();
    const int context = json::parse(ids.body)["max_model_len"].get<int>();
    const std::string exact = R"(,"seed":3,"max_tokens":)" + std::to_string(context - prompt);
    auto fits = post(port, "/v1/chat/completions", chat_body("hi", exact));
    CHECK(fits.status == 200 && json::parse(fits.body)["usage"]["completion_tokens"].get<int>() <= context - prompt,
          fits.body);
    expect_error(post(port, "/v1/chat/completions",
                      chat_body("hi", R"(,"max_tokens":)" + std::to_string(context - prompt + 1))),
                 400, "max_tokens", "context_length_exceeded", "prompt + max_tokens one past the positions");
  }
  std::string long_prompt;
  for (int i = 0; i < 300; ++i) long_prompt += "one two ";
  expect_error(post(port, "/v1/completions", R"({"model":")" + kModelId + R"(","prompt":")" + long_prompt + "\"}"), 400,
               "prompt", "context_length_exceeded", "prompt too long");
  expect_error(post(port, "/v1/chat/completions", chat_body(std::string(70000, 'a'))), 413, "", "body_too_large",
               "body over --max-body-bytes");
  expect_error(post(port, "/v1/chat/completions", chat_body("hi", R"(,"stream":"yes")")), 400, "stream", "invalid_type",
               "stream not a boolean");
  expect_error(post(port, "/v1/chat/completions", chat_body("hi", R"(,"stop":[1])")), 400, "stop[0]", "invalid_type",
               "stop not strings");
  expect_error(get(port, "/v1/nothing"), 404, "", "unknown_route", "unknown route");
  const Reply wrong_method = get(port, "/v1/chat/completions");
  expect_error(wrong_method, 405, "", "method_not_allowed", "GET on a POST route");
  CHECK(header(wrong_method, "Allow") == "POST, OPTIONS", header(wrong_method, "Allow"));
  expect_error(get(port, "/v1/models/"), 404, "", "unknown_route", "an empty model id");
  {
    // Route and method are judged before any body is read: a PUT that announces no length, or a
    // POST without a body to a route that does not take one, is answered at once.
    httplib::Client cli("127.0.0.1", port);
    cli.set_read_timeout(30, 0);
    const auto t0 = std::chrono::steady_clock::now();
    auto put = cli.Put("/v1/chat/completions");
    auto post_models = cli.Post("/v1/models");
    auto post_nowhere = cli.Post("/v1/nothing");
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    CHECK(put && put->status == 405, put ? put->body : "no answer to PUT");
    CHECK(post_models && post_models->status == 405, post_models ? post_models->body : "no answer to POST /v1/models");
    CHECK(post_nowhere && post_nowhere->status == 404, post_nowhere ? post_nowhere->body : "no answer to POST /v1/nothing");
    CHECK(seconds < 2.0, "answers without bodies took " + std::to_string(seconds) + " s (the read timeout is 5 s)");
  }
  {
    // A Content-Length that is no byte count is refused at once; a body announced over the limit
    // with Expect: 100-continue is refused before it is sent.
    const std::string bad_length = raw_response(
        port, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: -5\r\n\r\n");
    CHECK(bad_length.rfind("HTTP/1.1 400", 0) == 0 && bad_length.find("bad_request") != std::string::npos,
          "Content-Length -5: '" + bad_length + "'");
    // Content-Length headers that disagree are a framing error (RFC 9112 6.3), not "the first wins":
    // a proxy in front that reads the other would see another request boundary.
    const std::string two_lengths = raw_response(
        port, "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 2\r\n"
              "Content-Length: 40\r\n\r\n{}GET /health HTTP/1.1\r\nHost: x\r\n\r\n");
    CHECK(two_lengths.rfind("HTTP/1.1 400", 0) == 0 && two_lengths.find("bad_request") != std::string::npos &&
              two_lengths.find("Content-Length headers that disagree") != std::string::npos,
          "two Content-Length headers: '" + two_lengths + "'");
    // The same length twice is one length.
    const std::string same_twice = raw_response(
        port, "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 2\r\n"
              "Content-Length: 2\r\nConnection: close\r\n\r\n{}");
    CHECK(same_twice.rfind("HTTP/1.1 400", 0) == 0 && same_twice.find("missing_parameter") != std::string::npos,
          "the same Content-Length twice: '" + same_twice + "'");
    const std::string expect = raw_response(port,
                                           "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\n"
                                           "Content-Type: application/json\r\nContent-Length: 2000000\r\n\r\n");
    CHECK(expect.rfind("HTTP/1.1 413", 0) == 0, "Expect: 100-continue over the limit: '" + expect + "'");
  }
  {
    // Thousands of unknown fields are named in a bounded header.
    std::string extra;
    for (int i = 0; i < 2000; ++i) extra += ",\"unknown_field_" + std::to_string(i) + "\":1";
    const Reply many = post(port, "/v1/chat/completions", chat_body("hi", extra));
    CHECK(many.status == 200, many.body.substr(0, 300));
    const std::string ignored = header(many, "X-Dgemma-Ignored");
    CHECK(ignored.size() <= 1100 && ignored.find("more)") != std::string::npos, ignored.substr(0, 200));
  }
  {
    // A chunked body is bounded by --max-body-bytes like one with a Content-Length.
    httplib::Client cli("127.0.0.1", port);
    cli.set_read_timeout(30, 0);
    std::size_t sent = 0;
    auto res = cli.Post("/v1/chat/completions",
                        [&sent](std::size_t, httplib::DataSink& sink) {
                          const std::string piece(4096, ' ');
                          if (sent >= (std::size_t{1} << 20)) {
                            sink.done();
                            return true;
                          }
                          sent += piece.size();
                          return sink.write(piece.data(), piece.size());
                        },
                        "application/json");
    CHECK(res && res->status == 413, res ? res->body : std::string("no response to a chunked body over the limit"));
  }
  // A prompt near max_position_embeddings without max_tokens: the default is shortened to the whole
  // canvases that fit instead of refusing a field the client never sent.
  // (481 tokens: 31 positions are left, one 16-token canvas, where the checkpoint's default is 48.)
  std::string near_limit;
  for (int i = 0; i < 240; ++i) near_limit += "a ";
  auto fitted = post(port, "/v1/completions", R"({"model":")" + kModelId + R"(","prompt":")" + near_limit + "\"}");
  CHECK(fitted.status == 200 && json::parse(fitted.body)["usage"]["prompt_tokens"] == 481 &&
            json::parse(fitted.body)["usage"]["completion_tokens"].get<int>() <= 16,
        fitted.body);
  // Still serving after all that.
  auto again = post(port, "/v1/chat/completions", chat_body("Add: 417 + 385", R"(,"seed":7)"));
  CHECK(again.status == 200 && json::parse(again.body)["choices"][0]["message"]["content"] == ref["text"], again.body);

  // A client that hangs up mid-stream: its request is cancelled and its slot freed. (This raw
  // prompt makes the bundled model write all 400 tokens, about 25 canvases of 48 steps.)
  const std::string long_stream = R"({"model":")" + kModelId +
                                  R"(","prompt":"Sort ascending: 93 44 60 89 20","max_tokens":400,"stream":true,"dgemma":{"stability_threshold":100000}})";
  const double tokens_before = metric(get(port, "/metrics").body, "dgemma_generated_tokens_total");
  auto gone = post(port, "/v1/completions", long_stream, "", 200);
  CHECK(gone.body.size() >= 1, "the stream should have started");
  bool freed = false;
  for (int i = 0; i < 200 && !freed; ++i) {
    const std::string m = get(port, "/metrics").body;
    freed = metric(m, "dgemma_client_disconnects_total") >= 1 && metric(m, "dgemma_active_requests") == 0 &&
            metric(m, "dgemma_queue_depth") == 0;
    if (!freed) std::this_thread::sleep_for(std::chrono::milliseconds(25));
  }
  CHECK(freed, "after a hang-up: " + get(port, "/metrics").body);
  // Cancelled, not run to the end: fewer than the 400 tokens it would have generated.
  const double hung_up_tokens = metric(get(port, "/metrics").body, "dgemma_generated_tokens_total") - tokens_before;
  CHECK(hung_up_tokens < 400, "the hung-up request generated " + std::to_string(hung_up_tokens) + " tokens");

  // Metrics: every family the docs list, and the statuses seen above.
  const std::string m = get(port, "/metrics").body;
  for (const char* name :
       {"dgemma_requests_total{endpoint=\"/v1/chat/completions\",status=\"200\"}",
        "dgemma_requests_total{endpoint=\"/v1/chat/completions\",status=\"400\"}",
        "dgemma_requests_total{endpoint=\"/v1/chat/completions\",status=\"404\"}",
        "dgemma_requests_total{endpoint=\"/v1/chat/completions\",status=\"413\"}", "dgemma_queue_depth",
        "dgemma_active_requests", "dgemma_batch_size", "dgemma_generated_tokens_total",
        "dgemma_denoising_steps_per_canvas_count", "dgemma_tokens_per_forward_count",
        "dgemma_request_duration_seconds_count{endpoint=\"/v1/chat/completions\"}",
        "dgemma_time_to_first_chunk_seconds_count", "dgemma_memory_in_use_bytes", "dgemma_client_disconnects_total"}) {
    CHECK(metric(m, name) >= 0, std::string("missing metric ") + name);
  }
  CHECK(metric(m, "dgemma_generated_tokens_total") > 0, m);
}

void api_key_and_overload(const std::string& key) {
  ServerProcess s(g_dgemma, {"--model", g_model, "--threads", "1", "--api-key", key, "--max-batch", "1", "--max-queue",
                             "1", "--shutdown-timeout", "120", "--strict", "--cors-origin", "https://app.example"});
  const int port = s.port();
  // --strict: OpenAI's own refusals of what this server does not know or cannot honour.
  expect_error(post(port, "/v1/chat/completions", chat_body("hi", R"(,"max_token":5)"), key), 400, "max_token",
               "unknown_parameter", "unknown field under --strict");
  expect_error(post(port, "/v1/chat/completions", chat_body("hi", R"(,"temperature":0.2)"), key), 400, "temperature",
               "invalid_value", "temperature under --strict");
  // The API key's scheme name in any case (RFC 7235).
  CHECK(post(port, "/v1/chat/completions", chat_body("Add: 1 + 2"), "", 0, "bearer " + key).status == 200,
        "lower-case bearer");
  {
    // A browser's CORS preflight carries no key; the configured origin is allowed, others are not.
    httplib::Client cli("127.0.0.1", port);
    auto pre = cli.Options("/v1/chat/completions", {{"Origin", "https://app.example"},
                                                    {"Access-Control-Request-Method", "POST"},
                                                    {"Access-Control-Request-Headers", "authorization, content-type"}});
    CHECK(pre && pre->status == 204, pre ? std::to_string(pre->status) + pre->body : "no reply to a preflight");
    CHECK(pre && pre->get_header_value("Access-Control-Allow-Origin") == "https://app.example", "allow-origin");
    CHECK(pre && pre->get_header_value("Access-Control-Allow-Headers") == "authorization, content-type", "allow-headers");
    auto other = cli.Options("/v1/chat/completions", {{"Origin", "https://evil.example"},
                                                      {"Access-Control-Request-Method", "POST"}});
    CHECK(other && !other->has_header("Access-Control-Allow-Origin"), "another origin must not be allowed");
    auto models = cli.Get("/v1/models", {{"Origin", "https://app.example"}, {"Authorization", "Bearer " + key}});
    CHECK(models && models->status == 200 && models->get_header_value("Access-Control-Allow-Origin") == "https://app.example",
          "CORS header on an answer");
  }
  expect_error(post(port, "/v1/chat/completions", chat_body("hi")), 401, "", "invalid_api_key", "no API key");
  {
    httplib::Client cli("127.0.0.1", port);
    auto bodiless = cli.Post("/v1/chat/completions");  // the key is judged before the (missing) body
    CHECK(bodiless && bodiless->status == 401, bodiless ? bodiless->body : "no answer");
  }
  expect_error(post(port, "/v1/chat/completions", chat_body("hi"), "wrong"), 401, "", "invalid_api_key", "wrong API key");
  expect_error(get(port, "/v1/models", "wrong"), 401, "", "invalid_api_key", "wrong API key on /v1/models");
  expect_error(post(port, "/tokenize", R"({"prompt":"a"})"), 401, "", "invalid_api_key", "no API key on /tokenize");
  expect_error(post(port, "/completion", R"({"prompt":"a"})"), 401, "", "invalid_api_key", "no API key on /completion");
  CHECK(post(port, "/detokenize", R"({"tokens":[2]})", key).status == 200, "/detokenize with the key");
  CHECK(get(port, "/health").status == 200, "/health needs no key");
  auto ok = post(port, "/v1/chat/completions", chat_body("Add: 417 + 385"), key);
  CHECK(ok.status == 200, ok.body);

  // A body of 400000 nested arrays (800 KB, under the 1 MiB limit) where an error message quotes
  // the value: refused, and the server lives on (printing it overflowed a thread's stack).
  const std::string deep = std::string(400000, '[') + std::string(400000, ']');
  expect_error(post(port, "/v1/completions", R"({"model":")" + kModelId + R"(","prompt":"a","logprobs":)" + deep + "}", key),
               400, "", "invalid_json", "deeply nested body");
  CHECK(get(port, "/health").status == 200, "the server after a deeply nested body");
  // A request with more choices than --max-queue lets wait could never be queued whole: 400 naming
  // the field, not a 429 that a client would retry in vain (on this idle server it got 429).
  expect_error(post(port, "/v1/chat/completions", chat_body("hi", R"(,"n":2)"), key), 400, "n", "invalid_value",
               "n over --max-queue");
  expect_error(post(port, "/v1/completions", R"({"model":")" + kModelId + R"(","prompt":["a","b"]})", key), 400, "prompt",
               "invalid_value", "prompts over --max-queue");

  // One running, one queued at most: the rest of a burst gets 429 in OpenAI's format, and nothing else breaks.
  const std::string slow = R"({"model":")" + kModelId +
                           R"(","prompt":"Sort ascending: 93 44 60 89 20","max_tokens":400,"dgemma":{"stability_threshold":100000}})";
  std::vector<Reply> replies(6);
  std::vector<std::thread> burst;
  for (auto& r : replies) burst.emplace_back([&r, &slow, port, &key] { r = post(port, "/v1/completions", slow, key); });
  for (auto& t : burst) t.join();
  int ok200 = 0, busy = 0;
  for (const auto& r : replies) {
    if (r.status == 200) {
      ++ok200;
    } else {
      expect_error(r, 429, "", "queue_full", "overload");
      ++busy;
    }
  }
  // At least the first is served; how many of the others queue depends on when the worker admits it.
  CHECK(ok200 >= 1 && busy >= 1 && ok200 + busy == 6, "200: " + std::to_string(ok200) + ", 429: " + std::to_string(busy));

  // SIGTERM with a stream in flight: it finishes (drain), then the server exits 0. The drain limit
  // leaves room for sanitizer builds (a 200-token stream outlasted 20 s under ASan on AVX2).
  Reply drained;
  std::thread stream([&] {
    drained = post(port, "/v1/completions",
                   R"({"model":")" + kModelId +
                       R"(","prompt":"Sort ascending: 93 44 60 89 20","max_tokens":64,"stream":true,"dgemma":{"stability_threshold":100000}})",
                   key);
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(150));
  const int rc = s.terminate(30);
  stream.join();
  CHECK(rc == 0, "exit code after SIGTERM: " + std::to_string(rc) + "\n" + s.log());
  // Finished, not cut: "length", or "stop" where the kernels' rounding (AMX bf16 or fp32 FMA) leads
  // this prompt to an end-of-turn id first; a cancelled stream would end in an error instead.
  const std::string finish = stream_finish(drained);
  CHECK(drained.status == 200 && drained.done && (finish == "length" || finish == "stop"),
        "the stream in flight at SIGTERM: " + drained.body.substr(0, 400));
  CHECK(s.log().find("dgemma serve: stopped") != std::string::npos, s.log());
}

// --memory-budget refusals name the field to change, and a default max_tokens is fitted to the
// budget. The lengths are where request_bytes of the bundled model with one thread puts the 14 MiB
// line: after 170 prompt tokens two canvases fit and three do not; after 260 not even one.
void memory_budget() {
  ServerProcess s(g_dgemma, {"--model", g_model, "--threads", "1", "--memory-budget", "14"});
  const int port = s.port();
  const auto ids = [](int n) {
    json v = json::array({2});
    for (int i = 1; i < n; ++i) v.push_back(17);
    return v.dump();
  };
  const std::string model = R"({"model":")" + kModelId + R"(",)";
  // The prompt alone is over the budget: the prompt is named, whether alone, in a list or a chat.
  expect_error(post(port, "/v1/completions", model + R"("prompt":)" + ids(260) + R"(,"max_tokens":16})"), 400, "prompt",
               "request_too_large", "a prompt over the budget");
  expect_error(post(port, "/v1/completions", model + R"("prompt":["Add: 1 + 2",)" + ids(260) + "]}"), 400, "prompt[1]",
               "request_too_large", "the second prompt over the budget");
  std::string numbers;
  for (int i = 0; i < 100; ++i) numbers += " " + std::to_string(10 + (i * 37) % 90);
  expect_error(post(port, "/v1/chat/completions", chat_body("Sort ascending:" + numbers)), 400, "messages",
               "request_too_large", "a conversation over the budget");
  // A given max_tokens over the budget: max_tokens is named, with what would fit.
  const Reply over = post(port, "/v1/completions", model + R"("prompt":)" + ids(170) + R"(,"max_tokens":48})");
  expect_error(over, 400, "max_tokens", "request_too_large", "max_tokens over the budget");
  CHECK(over.body.find("at most 32 new tokens") != std::string::npos, over.body);
  // ... by the name the client used.
  expect_error(post(port, "/completion", R"({"prompt":)" + ids(170) + R"(,"n_predict":48})"), 400, "n_predict",
               "request_too_large", "llama.cpp's n_predict over the budget");
  // Without max_tokens the default (48) is shortened to what the budget holds after the prompt.
  const Reply fitted = post(port, "/completion", R"({"prompt":)" + ids(170) + "}");
  CHECK(fitted.status == 200, fitted.body);
  if (fitted.status == 200) {
    CHECK(json::parse(fitted.body)["generation_settings"]["n_predict"] == 32, fitted.body);
  }
  const Reply openai = post(port, "/v1/completions", model + R"("prompt":)" + ids(170) + "}");
  CHECK(openai.status == 200, openai.body);
  if (openai.status == 200) CHECK(json::parse(openai.body)["usage"]["completion_tokens"].get<int>() <= 32, openai.body);
  // The default is kept whole where the budget holds it.
  const Reply whole = post(port, "/completion", R"({"prompt":)" + ids(16) + "}");
  CHECK(whole.status == 200 && json::parse(whole.body)["generation_settings"]["n_predict"] == 48, whole.body);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: dg_serve_tests DGEMMA MODEL_DIR\n");
    return 2;
  }
  g_dgemma = argv[1];
  g_model = argv[2];
  // The server closes a connection whose body is over the limit while the client still writes it:
  // that write must fail, not kill this process.
  std::signal(SIGPIPE, SIG_IGN);
  try {
    {
      ServerProcess s(g_dgemma, {"--model", g_model, "--threads", "1", "--max-body-bytes", "65536"});
      contract(s.port());
      // An idle keep-alive connection (a load balancer's) must not hold the exit back by the
      // library's 5 s keep-alive timeout.
      const int idle = ::socket(AF_INET, SOCK_STREAM, 0);
      sockaddr_in addr{};
      addr.sin_family = AF_INET;
      addr.sin_port = htons(static_cast<std::uint16_t>(s.port()));
      addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
      const bool connected = ::connect(idle, reinterpret_cast<const sockaddr*>(&addr), sizeof addr) == 0;
      CHECK(connected, "could not open the idle connection");
      const auto t0 = std::chrono::steady_clock::now();
      const int rc = s.terminate(20);
      const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      ::close(idle);
      CHECK(rc == 0, "exit code after SIGTERM: " + std::to_string(rc));
      CHECK(seconds < 3.0, "SIGTERM with an idle connection open took " + std::to_string(seconds) + " s to exit");
      if (failures) std::fprintf(stderr, "server log:\n%s\n", s.log().c_str());
    }
    api_key_and_overload("sk-test-123");
    memory_budget();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "FAILED: %s\n", e.what());
    return 1;
  }
  if (failures) {
    std::fprintf(stderr, "%d checks failed\n", failures);
    return 1;
  }
  std::printf("dgemma serve contract: all checks passed\n");
  return 0;
}
