// SPDX-License-Identifier: Apache-2.0
// libFuzzer target: what `dgemma serve` does with a request body before the model sees it, on
// arbitrary bytes. The first byte picks the endpoint (chat or text completions) and --strict; the
// rest is the body. Parsing must end in a request or an ApiError (anything else would reach the
// client as a 500); a chat request must then render and tokenize, or fail with an Error. The
// bytes also drive the streaming text assembler with the request's stop sequences and max_tokens:
// the deltas of an answer streamed canvas by canvas must add up to the answer given at once. The
// same body also goes to the /tokenize and /detokenize parsers and to llama.cpp's /completion
// parser (whose response_fields then project an answer), under the same rule.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include <diffusion_gemma/io/chat_format.hpp>
#include <diffusion_gemma/io/tokenizer.hpp>

#include "../../examples/dgemma/serve/api.hpp"
#include "../../examples/dgemma/serve/llama_api.hpp"
#include "../../examples/dgemma/serve/sse.hpp"
#include "../../examples/dgemma/serve/text_stream.hpp"

namespace {

const diffusion_gemma::io::Tokenizer& tokenizer() {
  // Byte fallback: one character may span tokens, so canvases can split it.
  static const auto t =
      diffusion_gemma::io::Tokenizer::from_file(std::string(DG_FUZZ_FIXTURES) + "/tokenizers/gemma_bpe_1000.json");
  return t;
}

// The text a whole answer of `ids` gets, fed `canvas` tokens at a time (0: all at once).
std::string assemble(const std::vector<std::int32_t>& ids, std::size_t canvas, const dgemma::serve::GenerationRequest& r,
                     const char** reason) {
  dgemma::serve::TextAssembler a(
      [](const std::vector<std::int32_t>& t) { return tokenizer().decode(std::vector<int>(t.begin(), t.end()), true); },
      r.stop, r.max_tokens, [](std::int32_t id) { return tokenizer().decodes_with_next(id); });
  std::string streamed;
  if (canvas == 0) canvas = ids.size();
  for (std::size_t at = 0; at < ids.size() && !a.finished(); at += canvas) {
    const std::size_t n = std::min(canvas, ids.size() - at);
    const auto d = a.add(ids.data() + at, static_cast<int>(n), false, at + n == ids.size());
    streamed += d.text;
    if (d.finished) *reason = d.finish_reason;
  }
  if (streamed != a.text()) std::abort();  // the deltas are the assembler's text
  return streamed;
}

// /tokenize and /detokenize: a request or a 4xx ApiError; a tokenize request's text must encode.
void utility_endpoints(const std::string& body, const dgemma::serve::ApiLimits& limits) {
  const auto client_fault = [](const dgemma::serve::ApiError& e) {
    if (e.status() < 400 || e.status() > 499) std::abort();
    (void)dgemma::serve::dump_json(e.body());
  };
  try {
    const auto t = dgemma::serve::parse_tokenize_request(body, limits);
    try {
      if (t.chat) {
        std::vector<diffusion_gemma::io::ChatMessage> messages;
        for (const auto& m : t.messages) messages.push_back({m.role, m.content, m.text_parts});
        (void)diffusion_gemma::io::encode_chat(tokenizer(), messages);
      } else {
        (void)tokenizer().encode(t.text, t.add_special);
      }
    } catch (const diffusion_gemma::Error&) {
    }
  } catch (const dgemma::serve::ApiError& e) {
    client_fault(e);
  }
  try {
    (void)dgemma::serve::parse_detokenize_request(body, limits);
  } catch (const dgemma::serve::ApiError& e) {
    client_fault(e);
  }
  try {
    const auto r = dgemma::serve::parse_llama_completion_request(body, limits);
    for (const auto& p : r.prompts) {
      (void)tokenizer().encode(p.text);
      for (const auto& part : p.parts) (void)tokenizer().encode(part.text, false);
    }
    dgemma::serve::LlamaResult result;
    result.content = body;
    (void)dgemma::serve::dump_json(
        dgemma::serve::project_fields(dgemma::serve::llama_final(result, dgemma::serve::json::object(), "m", r.stream),
                                      r.response_fields));
  } catch (const dgemma::serve::ApiError& e) {
    client_fault(e);
  } catch (const diffusion_gemma::Error&) {
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size == 0) return 0;
  dgemma::serve::ApiLimits limits;
  limits.model_id = "dg-tiny-tasks";
  limits.default_max_tokens = 64;
  limits.max_tokens_limit = 512;
  limits.strict = (data[0] & 2) != 0;
  const bool chat = (data[0] & 1) != 0;
  const std::string body(reinterpret_cast<const char*>(data + 1), size - 1);
  utility_endpoints(body, limits);
  dgemma::serve::GenerationRequest r;
  try {
    r = chat ? dgemma::serve::parse_chat_request(body, limits) : dgemma::serve::parse_completion_request(body, limits);
  } catch (const dgemma::serve::ApiError& e) {
    if (e.status() < 400 || e.status() > 499) std::abort();  // a body is the client's fault, never the server's
    (void)dgemma::serve::dump_json(e.body());  // as the server sends it: a message may quote invalid UTF-8
    return 0;
  }
  try {
    if (chat) {
      std::vector<diffusion_gemma::io::ChatMessage> messages;
      for (const auto& m : r.messages) messages.push_back({m.role, m.content, m.text_parts});
      (void)diffusion_gemma::io::encode_chat(tokenizer(), messages);
    } else {
      for (const auto& p : r.prompts) {
        if (!p.is_ids) (void)tokenizer().encode(p.text);
      }
    }
  } catch (const diffusion_gemma::Error&) {
  }

  // An answer made of the body's bytes as token ids, streamed in canvases of 1 to 8 tokens.
  std::vector<std::int32_t> ids;
  for (std::size_t i = 1; i < size && ids.size() < 96; ++i) {
    const int id = data[i] % tokenizer().id_limit();
    if (tokenizer().has_id(id)) ids.push_back(id);
  }
  if (ids.empty()) return 0;
  const char* whole_reason = nullptr;
  const char* streamed_reason = nullptr;
  const std::string whole = assemble(ids, 0, r, &whole_reason);
  const std::string streamed = assemble(ids, 1 + data[0] % 8, r, &streamed_reason);
  if (streamed != whole || std::string(whole_reason ? whole_reason : "") != (streamed_reason ? streamed_reason : "")) {
    if (std::getenv("DG_FUZZ_DEBUG")) {
      std::fprintf(stderr, "canvas %d\nwhole    (%s) [%s]\nstreamed (%s) [%s]\nstops:", 1 + data[0] % 8, whole_reason, whole.c_str(),
                   streamed_reason, streamed.c_str());
      for (const auto& s : r.stop) std::fprintf(stderr, " [%s]", s.c_str());
      std::fprintf(stderr, "\nmax_tokens %d, ids:", r.max_tokens);
      for (auto id : ids) std::fprintf(stderr, " %d", id);
      std::fprintf(stderr, "\n");
    }
    std::abort();
  }
  return 0;
}
