// SPDX-License-Identifier: Apache-2.0
// dgemma serve: an OpenAI-compatible HTTP server (docs/serving.md).
//
// Threads: cpp-httplib's pool runs the handlers; ONE worker thread owns the engine and calls the
// batcher's step(). A handler parses and checks a request, submits it, then waits on the request's
// Channel for the events that the batcher's callbacks push from the worker thread. Handlers only
// submit and cancel, so no client can block the batch: a stream whose client has gone away fails
// its next write (a comment line every heartbeat keeps writes coming between canvases) and its
// request is cancelled, which frees its slot before the next pass.
#include <algorithm>
#include <cstdint>
#include <optional>
#include <atomic>
#include <cctype>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <iostream>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <pthread.h>
#include <sys/socket.h>
#include <unistd.h>

#include <diffusion_gemma/cpu/engine.hpp>
#include <diffusion_gemma/io/chat_format.hpp>
#include <diffusion_gemma/io/tokenizer.hpp>
#include <diffusion_gemma/runtime/batcher.hpp>
#include <diffusion_gemma/runtime/decoder.hpp>

#include "../commands.hpp"
#include "../common.hpp"
#include "api.hpp"
#include "channel.hpp"
#include "llama_api.hpp"
#include "metrics.hpp"
#include "responses.hpp"
#include "sse.hpp"
#include "text_stream.hpp"

// Last: httplib.h includes <resolv.h>, whose `_res` macro would rewrite parameter names in Eigen's
// headers (reached through the engine) if they were parsed after it.
#include <httplib.h>

namespace dgemma {

namespace dg = diffusion_gemma;

namespace {

using Engine = dg::cpu::Engine<dg::DiffusionGemmaBackbone>;
using Batcher = dg::ContinuousBatcher<Engine>;
using Options = Batcher::Options;
using Scheduler = dg::CanvasScheduler<>;
using Sampler = dg::ReferenceSampler;
using Clock = std::chrono::steady_clock;
using serve::ApiError;
using json = serve::json;

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

struct ServeConfig {
  std::string host = "127.0.0.1";
  int port = 8080;
  std::string api_key;
  std::string cors_origin;  // --cors-origin: the one origin (or "*") whose browser pages may call the API
  bool strict = false;      // --strict: refuse what the server would otherwise ignore (serve::ApiLimits::strict)
  std::size_t max_body_bytes = 1 << 20;
  int http_threads = 0;
  double shutdown_timeout = 10.0;
  std::chrono::milliseconds heartbeat{500};
};

// Constant time in the key's length, so that a wrong key's timing tells nothing about the right one.
bool same_secret(const std::string& a, const std::string& b) {
  unsigned char diff = a.size() == b.size() ? 0 : 1;
  for (std::size_t i = 0; i < a.size(); ++i) diff |= static_cast<unsigned char>(a[i] ^ b[i % (b.empty() ? 1 : b.size())]);
  return diff == 0 && !b.empty();
}

// A metrics label for a path: the routes served, or "other" (unknown paths must not grow the label set).
// llama.cpp's alias /completions counts as /completion, the label its latencies are recorded under.
std::string endpoint_label(const std::string& path) {
  if (path == "/completions") return "/completion";
  for (const char* p : {"/v1/chat/completions", "/v1/completions", "/completion", "/v1/models", "/health",
                        "/metrics", "/tokenize", "/detokenize"}) {
    if (path == p) return p;
  }
  if (path.rfind("/v1/models/", 0) == 0) return "/v1/models";
  return "other";
}

void send_error(httplib::Response& res, const ApiError& e) {
  res.status = e.status();
  // Overload and shutdown are temporary: say when to come back (OpenAI's clients honour it).
  if (e.status() == 429 || e.status() == 503) res.set_header("Retry-After", "1");
  res.set_content(serve::dump_json(e.body()), "application/json");
}

// "Bearer KEY", the scheme's name in any case (RFC 7235), the key exactly.
std::string bearer_token(const std::string& authorization) {
  const std::string scheme = "bearer ";
  if (authorization.size() < scheme.size()) return {};
  for (std::size_t i = 0; i < scheme.size(); ++i) {
    if (std::tolower(static_cast<unsigned char>(authorization[i])) != scheme[i]) return {};
  }
  std::size_t at = scheme.size();
  while (at < authorization.size() && authorization[at] == ' ') ++at;
  return authorization.substr(at);
}

// The POST routes: OpenAI's, llama.cpp's native completion, and the tokenizer's. All need the API key.
bool post_route(const std::string& path) {
  return path == "/v1/chat/completions" || path == "/v1/completions" || path == "/completion" || path == "/completions" ||
         path == "/tokenize" || path == "/detokenize";
}

// The routes and the methods each answers, for 405's Allow header and CORS preflights.
const char* allowed_methods(const std::string& path) {
  if (post_route(path)) return "POST, OPTIONS";
  const bool model_path = path.size() > 11 && path.rfind("/v1/models/", 0) == 0;  // "/v1/models/{id}", id not empty
  if (path == "/v1/models" || model_path || path == "/health" || path == "/metrics") {
    return "GET, HEAD, OPTIONS";
  }
  return nullptr;
}

// The request's Content-Length as a byte count; empty when it is absent or not a plain decimal
// number that fits 64 bits.
std::optional<std::uint64_t> content_length(const httplib::Request& req) {
  if (!req.has_header("Content-Length")) return std::nullopt;
  const std::string v = req.get_header_value("Content-Length");
  if (v.empty() || v.size() > 19) return std::nullopt;  // 19 digits always fit 64 bits
  std::uint64_t n = 0;
  for (const char c : v) {
    if (c < '0' || c > '9') return std::nullopt;
    n = n * 10 + static_cast<std::uint64_t>(c - '0');
  }
  return n;
}

// Whether `method` is one of the comma-separated names in `allow`.
bool method_allowed(const char* allow, const std::string& method) {
  const std::string list = allow;
  std::size_t at = 0;
  while (at < list.size()) {
    const std::size_t end = std::min(list.find(',', at), list.size());
    std::size_t b = at, e = end;
    while (b < e && list[b] == ' ') ++b;
    if (list.compare(b, e - b, method) == 0 && e - b == method.size()) return true;
    at = end + 1;
  }
  return false;
}

// The error code of a status that cpp-httplib sets itself, before any handler ran.
const char* protocol_error_code(int status) {
  switch (status) {
    case 400: return "bad_request";
    case 408: return "request_timeout";
    case 411: return "length_required";
    case 413: return "body_too_large";
    case 414: return "uri_too_long";
    case 416: return "range_not_satisfiable";
    case 431: return "headers_too_large";
    default: return status >= 500 ? "internal_error" : "bad_request";
  }
}

class Server {
 public:
  Server(std::shared_ptr<const dg::cpu::Model> model, std::unique_ptr<dg::io::Tokenizer> tok,
         dg::io::ChatOptions chat_options, dg::cpu::EngineOptions engine_options, Batcher::Limits limits,
         ServeConfig config, std::string model_id)
      : model_(std::move(model)),
        tok_(std::move(tok)),
        chat_options_(chat_options),
        engine_(model_, engine_options),
        batcher_(engine_, limits),
        limits_(limits),
        config_(std::move(config)),
        defaults_(dg::Decoder<Engine>::default_options(model_->generation_config())),
        created_(static_cast<std::int64_t>(std::time(nullptr))) {
    const auto& cfg = model_->config();
    api_.model_id = std::move(model_id);
    api_.strict = config_.strict;
    api_.default_max_tokens = defaults_.scheduler.max_new_tokens;
    api_.max_tokens_limit = static_cast<int>(std::min<std::int64_t>(cfg.max_position_embeddings, INT32_MAX));
    std::random_device rd;
    id_prefix_ = std::to_string(rd() % 100000);
  }

  // Binds, then serves until shutdown() (from the signal thread). Returns false if it cannot bind.
  bool run() {
    routes();
    const int threads = config_.http_threads;
    http_.new_task_queue = [threads] { return new httplib::ThreadPool(static_cast<std::size_t>(threads)); };
    http_.set_payload_max_length(config_.max_body_bytes);
    http_.set_keep_alive_timeout(5);
    // The listening socket: SO_REUSEADDR only (httplib's default adds SO_REUSEPORT, which would let a
    // second server bind the same port silently), and its fd, to raise the listen backlog below.
    int listen_fd = -1;
    http_.set_socket_options([&listen_fd](socket_t sock) {
      int yes = 1;
      ::setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof yes);
      listen_fd = sock;
    });
    int port = config_.port;
    if (port == 0) {
      port = http_.bind_to_any_port(config_.host);
      if (port <= 0) return false;
    } else if (!http_.bind_to_port(config_.host, port)) {
      return false;
    }
    // Debian's libcpp-httplib is compiled with a listen backlog of 5: a burst of new connections
    // overflows it and some clients get a reset instead of an answer. listen() again raises it.
    if (listen_fd >= 0) ::listen(listen_fd, SOMAXCONN);
    worker_ = std::thread([this] { worker_loop(); });
    std::fprintf(stderr, "dgemma serve: listening on http://%s:%d (model '%s', %d HTTP threads)\n", config_.host.c_str(),
                 port, api_.model_id.c_str(), threads);
    std::fflush(stderr);
    http_.listen_after_bind();
    listener_done_ = true;
    stop_worker_ = true;
    batcher_.interrupt();
    worker_.join();
    return true;
  }

  // Graceful: new generation requests get 503 and /health says "draining"; requests in flight get
  // up to --shutdown-timeout to finish, the rest are cancelled; then the listener closes.
  void shutdown() {
    draining_ = true;
    const auto deadline = Clock::now() + std::chrono::duration<double>(config_.shutdown_timeout);
    std::fprintf(stderr, "dgemma serve: shutting down, %d requests in flight\n", in_flight_.load());
    while (in_flight_.load() > 0 && Clock::now() < deadline && !force_) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    {
      std::lock_guard<std::mutex> lock(registry_mu_);
      cancelled_all_ = true;  // a request that registers from now on cancels itself
      for (auto& [id, channel] : registry_) {
        channel->abandoned = true;
        batcher_.cancel(id);
      }
    }
    const auto grace = Clock::now() + std::chrono::seconds(5);
    while (in_flight_.load() > 0 && Clock::now() < grace) std::this_thread::sleep_for(std::chrono::milliseconds(20));
    http_.stop();
    // The HTTP library joins its threads only when each idle keep-alive connection times out (5 s;
    // a load balancer keeps some open all the time), which would push the exit past a container's
    // stop timeout. Every answer has been sent by now, so a listener still open after a second is
    // only holding idle connections: leave without waiting for them.
    const auto idle = Clock::now() + std::chrono::seconds(1);
    while (!listener_done_ && Clock::now() < idle) std::this_thread::sleep_for(std::chrono::milliseconds(20));
    if (!listener_done_ && in_flight_.load() == 0) {
      std::fprintf(stderr, "dgemma serve: stopped (idle keep-alive connections closed)\n");
      std::fflush(stderr);
      std::fflush(stdout);
      std::_Exit(0);
    }
  }
  void force() { force_ = true; }

 private:
  void worker_loop() {
    while (!stop_worker_) {
      bool worked = false;
      try {
        worked = batcher_.step();
      } catch (const std::exception& e) {
        // The batcher reports per-request failures through on_done; an exception here is a bug or
        // an exhausted machine. Keep serving, and make it visible.
        std::fprintf(stderr, "dgemma serve: worker: %s\n", e.what());
        metrics_.worker_error();
      }
      if (!worked) batcher_.wait_for_work(std::chrono::milliseconds(50));
    }
  }

  void routes() {
    http_.set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
      using R = httplib::Server::HandlerResponse;
      const char* allow = allowed_methods(req.path);
      const std::string origin = req.get_header_value("Origin");
      const bool cors = !config_.cors_origin.empty() && !origin.empty() &&
                        (config_.cors_origin == "*" || config_.cors_origin == origin);
      if (cors) {
        res.set_header("Access-Control-Allow-Origin", config_.cors_origin == "*" ? "*" : origin);
        res.set_header("Vary", "Origin");
        res.set_header("Access-Control-Expose-Headers", "X-Dgemma-Seed, X-Dgemma-Ignored, Retry-After");
      }
      if (req.method == "OPTIONS") {  // a CORS preflight (it never carries the API key) or a plain OPTIONS
        if (allow == nullptr) return R::Unhandled;  // 404 from the error handler
        res.status = 204;
        res.set_header("Allow", allow);
        if (cors) {
          res.set_header("Access-Control-Allow-Methods", allow);
          const std::string asked = req.get_header_value("Access-Control-Request-Headers");
          res.set_header("Access-Control-Allow-Headers", asked.empty() ? "Authorization, Content-Type" : asked);
          res.set_header("Access-Control-Max-Age", "600");
        }
        return R::Handled;
      }
      // Route, method and key are judged here, before the HTTP library reads a body: a request
      // that will be refused anyway gets its 404, 405 or 401 at once, whatever body it announces
      // (a PUT without a length would otherwise be read until its connection closes).
      if (allow == nullptr) {
        send_error(res, ApiError(404, "unknown route: " + req.method + " " + req.path, "", "unknown_route"));
        return R::Handled;
      }
      if (!method_allowed(allow, req.method)) {
        res.set_header("Allow", allow);
        send_error(res, ApiError(405, "method " + req.method + " is not allowed on " + req.path + " (allowed: " + allow + ")",
                                 "", "method_not_allowed"));
        return R::Handled;
      }
      // /health and /metrics stay open for load balancers and scrapers; the API needs the key.
      if (!config_.api_key.empty() && (req.path.rfind("/v1/", 0) == 0 || post_route(req.path))) {
        const std::string auth = req.get_header_value("Authorization");
        if (!same_secret(bearer_token(auth), config_.api_key)) {
          send_error(res, ApiError(401, auth.empty() ? "missing API key: send 'Authorization: Bearer KEY'" : "invalid API key",
                                   "", "invalid_api_key"));
          return R::Handled;
        }
      }
      // A length that is not a decimal count (negative, garbage, past 2^64) is a malformed request
      // (RFC 9112); the library would wait its read timeout for such a body and then answer 413.
      if (req.has_header("Content-Length") && !content_length(req).has_value()) {
        res.set_header("Connection", "close");
        send_error(res, ApiError(400, "Content-Length '" + req.get_header_value("Content-Length") + "' is not a byte count",
                                 "", "bad_request"));
        return R::Handled;
      }
      // Several Content-Length headers that disagree leave the body's end undefined: a proxy in
      // front may read it by another than the first, which the HTTP library uses (request
      // smuggling). RFC 9112 (6.3) makes this an unrecoverable framing error.
      for (std::size_t i = 1; i < req.get_header_value_count("Content-Length"); ++i) {
        if (req.get_header_value("Content-Length", i) != req.get_header_value("Content-Length")) {
          res.set_header("Connection", "close");
          send_error(res, ApiError(400, "the request has Content-Length headers that disagree ('" +
                                            req.get_header_value("Content-Length") + "' and '" +
                                            req.get_header_value("Content-Length", i) + "')",
                                   "", "bad_request"));
          return R::Handled;
        }
      }
      // A POST with neither Content-Length nor chunked encoding has no body (RFC 9112); without
      // this check the HTTP library would wait for the connection to close to find its end.
      if (req.method == "POST" && !req.has_header("Content-Length") && !req.has_header("Transfer-Encoding")) {
        send_error(res, ApiError(400, "the request has no body (send JSON with a Content-Length)", "", "invalid_json"));
        return R::Handled;
      }
      return R::Unhandled;
    });
    // A client that asks before sending its body (Expect: 100-continue, as curl does past 1 KiB)
    // learns at once that it is over the limit, instead of uploading it to be dropped.
    http_.set_expect_100_continue_handler([this](const httplib::Request& req, httplib::Response& res) {
      const auto length = content_length(req);
      if (length.has_value() && *length > config_.max_body_bytes) {
        res.set_header("Connection", "close");
        send_error(res, body_too_large());
        return 413;
      }
      return 100;
    });
    http_.set_error_handler([this](const httplib::Request& req, httplib::Response& res) {
      if (!res.body.empty()) return;  // a handler's own error JSON
      const char* allow = allowed_methods(req.path);
      if (res.status == 404 && allow != nullptr) {
        // A route that exists, asked with another method.
        res.set_header("Allow", allow);
        send_error(res, ApiError(405, "method " + req.method + " is not allowed on " + req.path + " (allowed: " + allow + ")",
                                 "", "method_not_allowed"));
      } else if (res.status == 404) {
        send_error(res, ApiError(404, "unknown route: " + req.method + " " + req.path, "", "unknown_route"));
      } else if (res.status == 413) {
        send_error(res, body_too_large());
      } else {
        // The HTTP library refused the request before routing it (a malformed request line or
        // header, a URI or headers over its limits): the method and path may be unknown.
        const std::string what = req.method.empty() ? std::string("a malformed HTTP request")
                                                    : req.method + " " + (req.path.empty() ? "(no path)" : req.path);
        send_error(res, ApiError(res.status, "HTTP " + std::to_string(res.status) + " for " + what, "",
                                 protocol_error_code(res.status)));
      }
    });
    http_.set_exception_handler([](const httplib::Request&, httplib::Response& res, std::exception_ptr ep) {
      std::string what = "internal error";
      try {
        std::rethrow_exception(ep);
      } catch (const std::exception& e) {
        what = e.what();
      } catch (...) {
      }
      send_error(res, ApiError(500, what, "", "internal_error"));
    });
    http_.set_logger([this](const httplib::Request& req, const httplib::Response& res) {
      metrics_.request(endpoint_label(req.path), res.status);
    });

    http_.Get("/health", [this](const httplib::Request&, httplib::Response& res) {
      const auto s = batcher_.stats();
      json j{{"status", draining_ ? "draining" : "ok"}, {"model", api_.model_id}, {"queued", s.queued}, {"active", s.active}};
      res.status = draining_ ? 503 : 200;
      res.set_content(serve::dump_json(j), "application/json");
    });
    http_.Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
      const auto s = batcher_.stats();
      serve::EngineGauges g;
      g.queued = s.queued;
      g.active = s.active;
      g.bytes_in_use = s.bytes_in_use;
      g.memory_budget = limits_.memory_budget_bytes;
      g.last_batch = s.active > 0 ? s.last_batch : 0;  // an idle server denoises nothing
      g.passes = s.passes;
      g.denoise_rows = s.denoise_rows;
      res.set_content(metrics_.render(g), "text/plain; version=0.0.4");
    });
    http_.Get("/v1/models", [this](const httplib::Request&, httplib::Response& res) {
      res.set_content(json{{"object", "list"}, {"data", json::array({model_object()})}}.dump(), "application/json");
    });
    http_.Get(R"(/v1/models/(.+))", [this](const httplib::Request& req, httplib::Response& res) {
      if (req.matches[1] != api_.model_id) {
        send_error(res, ApiError(404, "the model '" + std::string(req.matches[1]) + "' does not exist", "model",
                                 "model_not_found"));
        return;
      }
      res.set_content(model_object().dump(), "application/json");
    });
    // The body is read here rather than by the library, so that --max-body-bytes bounds chunked
    // bodies too (the library checks only a Content-Length).
    const auto post = [this](void (Server::*handle)(const std::string&, httplib::Response&)) {
      return [this, handle](const httplib::Request&, httplib::Response& res, const httplib::ContentReader& read) {
        std::string body;
        bool too_large = false;
        std::size_t received = 0;
        const bool complete = read([&](const char* data, std::size_t length) {
          received += length;
          if (received > config_.max_body_bytes) {
            // Over the limit: nothing more is kept, but up to 16 MiB more is read and dropped, so that
            // a client that sends its whole body before reading (most do) receives the 413 rather than
            // a reset connection. Past that the connection is cut.
            too_large = true;
            body.clear();
            body.shrink_to_fit();
            return received - config_.max_body_bytes <= (std::size_t{16} << 20);
          }
          body.append(data, length);
          return true;
        });
        if (too_large || res.status == 413) {
          res.set_header("Connection", "close");  // what is left of the body (past the drain) is never read
          send_error(res, body_too_large());
          return;
        }
        if (!complete) {
          res.set_header("Connection", "close");
          send_error(res, ApiError(400, "the request body could not be read (malformed chunked encoding, bad "
                                        "compression, or the client stopped sending)", "", "bad_request"));
          return;
        }
        (this->*handle)(body, res);
      };
    };
    http_.Post("/v1/chat/completions", post(&Server::chat_completion));
    http_.Post("/v1/completions", post(&Server::completion));
    http_.Post("/completion", post(&Server::llama_completion));
    http_.Post("/completions", post(&Server::llama_completion));  // llama.cpp's alias of /completion
    http_.Post("/tokenize", post(&Server::tokenize));
    http_.Post("/detokenize", post(&Server::detokenize));
  }

  enum class Dialect { kChat, kCompletions, kLlama };
  void chat_completion(const std::string& body, httplib::Response& res) { generation(body, res, Dialect::kChat); }
  void completion(const std::string& body, httplib::Response& res) { generation(body, res, Dialect::kCompletions); }
  void llama_completion(const std::string& body, httplib::Response& res) { generation(body, res, Dialect::kLlama); }

  // vLLM's and llama.cpp's /tokenize: the ids the generation endpoints would run for this text or
  // conversation (the same tokenization code), with vLLM's count and max_model_len.
  void tokenize(const std::string& body, httplib::Response& res) {
    try {
      const serve::TokenizeRequest r = serve::parse_tokenize_request(body, api_);
      const std::vector<int> ids = r.chat ? chat_ids(r.messages, r.enable_thinking) : text_ids(r.text, r.add_special);
      json tokens = json::array();
      for (int id : ids) {
        if (!r.with_pieces) {
          tokens.push_back(id);
          continue;
        }
        // llama.cpp's piece: the token's text, or its byte when a byte token is not UTF-8 alone.
        const std::string name = tok_->id_to_token(id);
        unsigned byte = 0;
        if (name.size() == 6 && name.compare(0, 3, "<0x") == 0 && name[5] == '>' &&
            std::sscanf(name.c_str() + 3, "%2x", &byte) == 1 && byte >= 0x80) {
          tokens.push_back(json{{"id", id}, {"piece", json::array({byte})}});
        } else {
          tokens.push_back(json{{"id", id}, {"piece", tok_->decode(std::vector<int>{id}, false)}});
        }
      }
      json out{{"tokens", tokens}, {"count", ids.size()}, {"max_model_len", model_->config().max_position_embeddings}};
      if (r.return_token_strs) {
        json strs = json::array();
        for (int id : ids) strs.push_back(tok_->id_to_token(id));
        out["token_strs"] = strs;
      }
      set_ignored_header(res, r.ignored);
      res.set_content(serve::dump_json(out), "application/json");
    } catch (const ApiError& e) {
      send_error(res, e);
    } catch (const dg::Error& e) {  // the chat format's refusals, as the generation endpoints map them
      send_error(res, submit_error(e));
    }
  }

  // vLLM's and llama.cpp's /detokenize: the text of the ids, special tokens included; the text is
  // under both dialects' keys ("prompt" for vLLM, "content" for llama.cpp).
  void detokenize(const std::string& body, httplib::Response& res) {
    try {
      const serve::DetokenizeRequest r = serve::parse_detokenize_request(body, api_);
      std::vector<int> ids;
      for (std::size_t i = 0; i < r.tokens.size(); ++i) {
        const std::int64_t id = r.tokens[i];
        const std::string where = "tokens[" + std::to_string(i) + "]";
        check_client_id(id, where);
        if (!tok_->has_id(static_cast<int>(id))) {
          throw ApiError(400, "'" + where + "' is token id " + std::to_string(id) + ", which tokenizer.json has no text for",
                         where, "invalid_value");
        }
        ids.push_back(static_cast<int>(id));
      }
      const std::string text = tok_->decode(ids, false);
      set_ignored_header(res, r.ignored);
      res.set_content(serve::dump_json(json{{"prompt", text}, {"content", text}}), "application/json");
    } catch (const ApiError& e) {
      send_error(res, e);
    }
  }

  ApiError body_too_large() const {
    return ApiError(413, "the request body exceeds " + std::to_string(config_.max_body_bytes) + " bytes (--max-body-bytes)",
                    "", "body_too_large");
  }

  json model_object() const {
    // max_model_len as vLLM reports it: clients size prompts by it.
    return json{{"id", api_.model_id},
                {"object", "model"},
                {"created", created_},
                {"owned_by", "dgemma"},
                {"max_model_len", model_->config().max_position_embeddings}};
  }

  // Text of ids; ids the tokenizer does not know show as <ID>.
  std::string decode(const std::vector<std::int32_t>& ids) const { return decode_known(*tok_, ids); }

  // A client's token id: inside the model's vocabulary, or a 400 naming where it was given.
  void check_client_id(std::int64_t id, const std::string& where) const {
    if (id >= model_->config().vocab_size) {
      throw ApiError(400, "'" + where + "' is token id " + std::to_string(id) + ", outside the vocabulary [0, " +
                              std::to_string(model_->config().vocab_size) + ")",
                     where, "invalid_value");
    }
  }

  // Text as /v1/completions runs it: <bos> first whether or not tokenizer.json's post-processor
  // adds it (as `dgemma generate`); without add_bos, the bare encoding (/tokenize may ask for it).
  std::vector<int> text_ids(const std::string& text, bool add_bos) const {
    std::vector<int> ids = tok_->encode(text, add_bos);
    const int bos = model_->config().bos_token_id;
    if (add_bos && (ids.empty() || ids[0] != bos)) ids.insert(ids.begin(), bos);
    return ids;
  }

  // A conversation as /v1/chat/completions renders it.
  std::vector<int> chat_ids(const std::vector<serve::Message>& messages, bool enable_thinking) const {
    std::vector<dg::io::ChatMessage> msgs;
    for (const auto& m : messages) msgs.push_back({m.role, m.content, m.text_parts});
    dg::io::ChatOptions options = chat_options_;
    options.enable_thinking = enable_thinking;
    return dg::io::encode_chat(*tok_, msgs, options);
  }

  // The token ids of the request's sequence `choice` (chat: the conversation; completions: prompt
  // `choice` of the list). `param` names that prompt in errors.
  std::vector<std::int32_t> prompt_ids(const serve::GenerationRequest& r, std::size_t choice, const std::string& param) const {
    if (!r.chat && r.prompts[choice].is_ids) {
      const auto& given = r.prompts[choice].ids;
      std::vector<std::int32_t> out;
      for (std::size_t i = 0; i < given.size(); ++i) {
        check_client_id(given[i], param + "[" + std::to_string(i) + "]");
        out.push_back(static_cast<std::int32_t>(given[i]));
      }
      return out;  // as given: token ids are the exact prompt, <bos> included or not
    }
    std::vector<int> ids;
    if (r.chat) {
      ids = chat_ids(r.messages, r.enable_thinking);
    } else if (r.prompts[choice].parts.empty()) {
      ids = text_ids(r.prompts[choice].text, true);
    } else {
      // llama.cpp's mixed prompt: <bos> first when it starts with a string; each string is encoded
      // alone, without special tokens, and the ids go in as given.
      const auto& parts = r.prompts[choice].parts;
      if (!parts[0].is_ids) ids.push_back(model_->config().bos_token_id);
      std::size_t at = 0;  // the position in the client's list, for errors
      for (const auto& part : parts) {
        if (!part.is_ids) {
          const std::vector<int> piece = text_ids(part.text, false);
          ids.insert(ids.end(), piece.begin(), piece.end());
          ++at;
          continue;
        }
        for (std::int64_t id : part.ids) {
          check_client_id(id, param + "[" + std::to_string(at++) + "]");
          ids.push_back(static_cast<int>(id));
        }
      }
    }
    std::vector<std::int32_t> out;
    for (int id : ids) {
      if (id < 0 || id >= model_->config().vocab_size) {
        throw ApiError(500, "the tokenizer produced id " + std::to_string(id) + ", outside the model's vocabulary");
      }
      out.push_back(id);
    }
    return out;
  }

  // The request's options over the checkpoint's, checked the way the batcher will check them, so
  // that each refusal names the request field at fault.
  Options options_for(const serve::GenerationRequest& r, int max_tokens, std::int64_t prompt_length,
                      const std::string& prompt_param) const {
    Options o = defaults_;
    o.scheduler.max_new_tokens = max_tokens;
    o.sampler.rng.seed = r.seed;
    o.memory_budget_bytes = limits_.memory_budget_bytes;
    const auto& s = r.sampler;
    if (s.max_denoising_steps) o.sampler.max_denoising_steps = *s.max_denoising_steps;
    if (s.t_min) o.sampler.schedule.t_min = *s.t_min;
    if (s.t_max) o.sampler.schedule.t_max = *s.t_max;
    if (s.entropy_bound) o.sampler.acceptance.entropy_bound = *s.entropy_bound;
    if (s.stability_threshold) o.sampler.stopping.stability_threshold = *s.stability_threshold;
    if (s.confidence_threshold) o.sampler.stopping.confidence_threshold = *s.confidence_threshold;
    if (!(o.sampler.schedule.t_max > o.sampler.schedule.t_min)) {
      throw ApiError(400, "'dgemma.t_max' must be greater than 'dgemma.t_min' (t_min " +
                              std::to_string(o.sampler.schedule.t_min) + ", t_max " +
                              std::to_string(o.sampler.schedule.t_max) + ")",
                     s.t_max ? "dgemma.t_max" : "dgemma.t_min", "invalid_value");
    }
    const dg::Status st = Sampler::can_implement(o.sampler);
    if (!st.ok()) throw ApiError(400, "dgemma: " + st.message(), "dgemma", "invalid_value");
    const auto& cfg = model_->config();
    Scheduler::Plan plan;
    try {
      plan = Scheduler::plan(o.scheduler, cfg, prompt_length);
    } catch (const dg::Error& e) {
      const bool prompt_alone = prompt_length + cfg.canvas_length > cfg.max_position_embeddings;
      std::string why = e.what();
      const std::string tokens = std::to_string(prompt_length) + " tokens";
      if (why.find(tokens) == std::string::npos) why += " (the prompt is " + tokens + ")";
      throw ApiError(400, why, prompt_alone ? prompt_param : r.max_tokens_param, "context_length_exceeded");
    }
    // The batcher would refuse the same request with kOutOfRange; checked here so that the answer
    // names the field to change: the prompt when even one canvas after it is over the budget.
    const std::size_t budget = limits_.memory_budget_bytes;
    const std::size_t need = budget > 0 ? dg::request_bytes_of<Scheduler>(engine_, plan, prompt_length) : 0;
    if (need > budget) {
      const int fit = new_tokens_within_budget(o.scheduler, prompt_length, max_tokens);
      const auto mib = [](std::size_t b) { return std::to_string(static_cast<long long>((b + (1 << 20) - 1) >> 20)) + " MiB"; };
      const auto needs = [&](const Scheduler::Plan& p) {
        return "about " + mib(dg::request_bytes_of<Scheduler>(engine_, p, prompt_length)) + " (KV cache for " +
               std::to_string(p.cache_capacity) + " positions and workspace)";
      };
      const std::string tokens = std::to_string(prompt_length) + " tokens";
      if (fit > 0) {
        throw ApiError(400,
                       "the request needs " + needs(plan) + ", more than the server's --memory-budget of " + mib(budget) +
                           "; at most " + std::to_string(fit) + " new tokens (whole canvases) fit after this prompt of " + tokens,
                       r.max_tokens_param, "request_too_large");
      }
      Scheduler::Arguments one = o.scheduler;
      one.max_new_tokens = 1;
      throw ApiError(400,
                     "the prompt (" + tokens + ") does not fit in the server's --memory-budget of " + mib(budget) +
                         " even with one canvas: it needs " + needs(Scheduler::plan(one, cfg, prompt_length)),
                     prompt_param, "request_too_large");
    }
    return o;
  }

  // The largest number of new tokens, up to `limit` and in whole canvases, whose request fits in
  // --memory-budget after a prompt of `prompt_length` tokens (0: not even one canvas does). The
  // scheduler must accept `limit` after this prompt.
  int new_tokens_within_budget(Scheduler::Arguments a, std::int64_t prompt_length, int limit) const {
    const auto& cfg = model_->config();
    const std::size_t budget = limits_.memory_budget_bytes;
    for (int tokens = limit; tokens > 0;) {
      a.max_new_tokens = tokens;
      const auto plan = Scheduler::plan(a, cfg, prompt_length);
      if (budget == 0 || dg::request_bytes_of<Scheduler>(engine_, plan, prompt_length) <= budget) return tokens;
      // One canvas fewer: the sum of the plan's canvases before its last.
      int fewer = 0;
      for (int b = 0; b + 1 < plan.num_canvases; ++b) fewer += Scheduler::Blocks::canvas_length(cfg, b);
      tokens = std::min(fewer, tokens - 1);
    }
    return 0;
  }

  ApiError submit_error(const dg::Error& e) const {
    const std::string what = e.what();
    if (e.code() == dg::StatusCode::kUnavailable) return ApiError(429, "the server is busy: " + what, "", "queue_full");
    // Positions and memory were checked before submitting (options_for), naming the field at fault;
    // an out-of-range request that still reaches here needs more than the whole --memory-budget.
    if (e.code() == dg::StatusCode::kOutOfRange) return ApiError(400, what, "", "request_too_large");
    if (e.code() == dg::StatusCode::kInvalidArgument) return ApiError(400, what, "", "invalid_value");
    return ApiError(500, what, "", "internal_error");
  }

  // One sequence of a request: a chat conversation, or one prompt of a completions list.
  struct Choice {
    Batcher::RequestId id = 0;
    std::unique_ptr<serve::TextAssembler> text;
    int prompt_tokens = 0;
    bool first_sample = true;  // the first of its prompt's n samples: counts the prompt in the usage
    bool done = false;         // its text is complete (later events of it are ignored)
    // llama.cpp's answer: the prompt as run, the settings used, timings, ids already streamed.
    std::string prompt_text;
    json settings;
    Clock::time_point first_commit{};
    double first_canvas_seconds = 0.0, canvas_seconds = 0.0;
    std::size_t tokens_streamed = 0;
  };

  // Everything a request's handler (and, for a stream, its content provider) needs. The choices
  // share one channel; each event names its choice.
  struct Job {
    std::vector<Choice> choices;
    std::size_t done = 0;
    std::shared_ptr<serve::Channel> channel;
    std::unique_ptr<serve::ResponseShape> shape;
    serve::GenerationRequest request;
    Clock::time_point arrived;
    bool first_chunk = false;
    bool role_sent = false;
    bool finished = false;
    bool failed = false;  // a choice failed: the response is an error, the other choices are stopped
    std::string endpoint;

    serve::ResponseShape::Choice result(std::size_t i, const char* reason) const { return {choices[i].text->text(), reason}; }
    nlohmann::ordered_json usage() const {
      int prompt = 0, completion = 0;
      for (const auto& c : choices) {
        if (c.first_sample) prompt += c.prompt_tokens;  // OpenAI counts a prompt once, whatever n
        completion += c.text->completion_tokens();
      }
      return serve::ResponseShape::usage(prompt, completion);
    }
  };

  void generation(const std::string& body, httplib::Response& res, Dialect dialect) {
    const bool chat = dialect == Dialect::kChat;
    auto job = std::make_shared<Job>();
    job->arrived = Clock::now();
    job->endpoint = chat ? "/v1/chat/completions" : dialect == Dialect::kLlama ? "/completion" : "/v1/completions";
    // llama.cpp's n_predict 0: the prompt is checked and answered with no tokens, nothing runs.
    bool nothing_to_generate = false;
    try {
      if (draining_) throw ApiError(503, "the server is shutting down", "", "shutting_down");
      job->request = chat ? serve::parse_chat_request(body, api_)
                     : dialect == Dialect::kLlama ? serve::parse_llama_completion_request(body, api_)
                                                  : serve::parse_completion_request(body, api_);
      nothing_to_generate = job->request.llama && job->request.max_tokens_given && job->request.max_tokens == 0;
      if (job->request.random_seed) {
        // 32 bits, as llama.cpp's seeds: a seed reported back must survive a JavaScript client's
        // JSON numbers (exact only below 2^53) to replay the answer.
        std::random_device rd;
        job->request.seed = static_cast<std::uint32_t>(rd());
      }
      job->channel = std::make_shared<serve::Channel>();
      // Choices in OpenAI's order: prompt by prompt, n samples each; sample j uses seed + j.
      const std::size_t prompts = chat ? 1 : job->request.prompts.size();
      const std::size_t samples = static_cast<std::size_t>(job->request.n);
      std::vector<std::pair<std::vector<std::int32_t>, Options>> planned;
      for (std::size_t k = 0; k < prompts * samples; ++k) {
        // Every prompt is checked before any is submitted: a request runs whole or not at all.
        const std::size_t i = k / samples;
        const std::string param = chat ? "messages" : prompts == 1 ? "prompt" : "prompt[" + std::to_string(i) + "]";
        auto prompt = k % samples == 0 ? prompt_ids(job->request, i, param) : planned.back().first;
        const serve::GenerationRequest& r = job->request;
        const int prompt_tokens = static_cast<int>(prompt.size());
        int max_tokens = r.max_tokens;
        const auto& cfg = model_->config();
        // The checkpoint's default is a default, not the client's limit: shorten it to the whole
        // canvases that fit after this prompt, as OpenAI and vLLM fit theirs to the context. A
        // given limit that OpenAI's and vLLM's rule accepts (prompt + max_tokens within the
        // context) is shortened the same way when only its last canvas would not fit, and the
        // answer ends with "length"; beyond the context it is refused (options_for).
        if (!r.max_tokens_given || prompt_tokens + static_cast<std::int64_t>(max_tokens) <= cfg.max_position_embeddings) {
          const int fit = Scheduler::max_new_tokens_that_fit(cfg, prompt_tokens, max_tokens);
          if (fit > 0) max_tokens = fit;
        }
        // The default is also shortened to what --memory-budget holds after this prompt; a given
        // limit over the budget is refused, naming max_tokens (options_for).
        if (!r.max_tokens_given && !nothing_to_generate && limits_.memory_budget_bytes > 0 &&
            prompt_tokens + static_cast<std::int64_t>(max_tokens) <= cfg.max_position_embeddings) {
          Scheduler::Arguments a = defaults_.scheduler;
          try {
            const int fit = new_tokens_within_budget(a, prompt_tokens, max_tokens);
            if (fit > 0) max_tokens = fit;
          } catch (const dg::Error&) {
            // the scheduler refuses this prompt: options_for reports it, naming the field
          }
        }
        Options o = nothing_to_generate ? defaults_ : options_for(r, max_tokens, prompt_tokens, param);
        if (nothing_to_generate) o.sampler.rng.seed = r.seed;
        o.sampler.rng.seed += k % samples;
        Choice c;
        c.prompt_tokens = prompt_tokens;
        c.first_sample = k % samples == 0;
        c.text = std::make_unique<serve::TextAssembler>(
            [this](const std::vector<std::int32_t>& ids) { return decode(ids); }, r.stop, max_tokens,
            [this](std::int32_t id) { return tok_->has_id(id) && tok_->decodes_with_next(id); });
        if (r.llama) {
          c.prompt_text = decode_known(*tok_, prompt, /*skip_special_tokens=*/false);  // as llama.cpp reports it
          c.settings = llama_settings(r, o, max_tokens);
        }
        job->choices.push_back(std::move(c));
        planned.emplace_back(std::move(prompt), std::move(o));
      }
      const std::uint64_t number = ++request_counter_;
      job->shape = std::make_unique<serve::ResponseShape>(
          chat, (chat ? "chatcmpl-" : "cmpl-") + id_prefix_ + "-" + std::to_string(number),
          static_cast<std::int64_t>(std::time(nullptr)), api_.model_id);
      if (nothing_to_generate) {
        answer_without_tokens(*job, res);
        return;
      }
      // Each choice waits in the batcher's queue as its own sequence: a request with more of them
      // than --max-queue could never be queued whole, so it is the client's to change (400), not
      // a busy server's to retry (429), which a client retrying with backoff would do in vain.
      if (planned.size() > limits_.max_queue) {
        const bool by_n = job->request.n > 1;
        throw ApiError(400, std::string(by_n ? "'n'" : "'prompt'") + ": the request asks for " +
                                std::to_string(planned.size()) + " sequences (" + std::to_string(prompts) + " prompt" +
                                (prompts == 1 ? "" : "s") + " x n " + std::to_string(samples) +
                                "), more than this server queues at once (--max-queue " +
                                std::to_string(limits_.max_queue) + ")",
                       by_n ? "n" : "prompt", "invalid_value");
      }
      for (std::size_t i = 0; i < planned.size(); ++i) {
        try {
          job->choices[i].id = submit(planned[i].first, planned[i].second, job->channel, i, job->request.stream_drafts);
        } catch (...) {
          for (std::size_t k = 0; k < i; ++k) batcher_.cancel(job->choices[k].id);  // a full queue refuses them all
          throw;
        }
      }
    } catch (const ApiError& e) {
      send_error(res, e);
      return;
    } catch (const dg::Error& e) {
      send_error(res, submit_error(e));
      return;
    }
    ++in_flight_;
    {
      std::lock_guard<std::mutex> lock(registry_mu_);
      for (const auto& c : job->choices) registry_[c.id] = job->channel;
      // Admitted just before shutdown began, but registered after its sweep: stop here, or the
      // request would run to the end and hold the exit past --shutdown-timeout.
      if (cancelled_all_) stop_generation(*job);
    }
    // The seed the answer came from (drawn for "seed": -1), and the fields accepted without effect.
    res.set_header("X-Dgemma-Seed", std::to_string(job->request.seed));
    set_ignored_header(res, job->request.ignored);
    if (job->request.stream) {
      res.set_header("Cache-Control", "no-cache");
      res.set_header("X-Accel-Buffering", "no");  // nginx: pass each chunk on at once
      res.set_chunked_content_provider(
          "text/event-stream",
          [this, job](std::size_t, httplib::DataSink& sink) { return stream_some(*job, sink); },
          [this, job](bool) { finish(*job); });
      return;
    }
    try {
      answer(*job, res);
    } catch (...) {
      finish(*job);
      throw;
    }
    finish(*job);
  }

  // The fields accepted without effect, named in the X-Dgemma-Ignored response header.
  static void set_ignored_header(httplib::Response& res, const std::vector<std::string>& ignored) {
    if (ignored.empty()) return;
    // Bounded: proxies refuse responses whose headers pass a few KiB (nginx's default buffer is
    // 4 KiB), and a request may carry thousands of unknown fields.
    constexpr std::size_t kMaxIgnoredHeader = 1024;
    std::string names;
    std::size_t listed = 0;
    for (const auto& k : ignored) {
      if (names.size() + k.size() + 2 > kMaxIgnoredHeader) break;
      std::string shown = k;  // a header value cannot carry control characters (CR/LF would drop it)
      for (char& c : shown) {
        if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) c = '?';
      }
      names += (names.empty() ? "" : ", ") + shown;
      ++listed;
    }
    if (listed < ignored.size()) {
      names += (names.empty() ? "" : ", ") + std::string("... (") + std::to_string(ignored.size() - listed) +
               " more)";
    }
    res.set_header("X-Dgemma-Ignored", names);
  }

  Batcher::RequestId submit(const std::vector<std::int32_t>& prompt, const Options& o,
                            const std::shared_ptr<serve::Channel>& channel, std::size_t choice, bool drafts) {
    Batcher::Request br;
    br.prompt = prompt;
    br.options = o;
    // These run on the worker thread: copy what the handler needs and return at once.
    br.callbacks.on_step = [channel, choice, drafts](const dg::StepEvent& e) {
      if (channel->abandoned) return false;
      if (drafts) {
        serve::Event ev;
        ev.kind = serve::Event::Kind::kDraft;
        ev.choice = choice;
        ev.canvas = e.record.canvas;
        ev.step = e.record.step;
        ev.accepted = e.record.accepted;
        ev.tokens.assign(e.draft, e.draft + e.length);
        channel->push(std::move(ev));
      }
      return true;
    };
    br.callbacks.on_commit = [channel, choice](const dg::CommitEvent& e) {
      if (channel->abandoned) return false;
      serve::Event ev;
      ev.kind = serve::Event::Kind::kCommit;
      ev.choice = choice;
      ev.canvas = e.record.canvas;
      ev.step = e.record.steps;
      ev.tokens.assign(e.tokens, e.tokens + e.valid_tokens);
      ev.stop_token = e.record.stop_token;
      ev.last = e.final;
      ev.seconds = e.record.seconds;
      channel->push(std::move(ev));
      return true;
    };
    br.on_done = [this, channel, choice](const dg::GenerationResult& r, const dg::Status& s) {
      if (r.forwards > 0) {  // cancelled ones too: a stop sequence or a disconnect still cost these tokens
        std::vector<int> steps;
        for (const auto& c : r.canvases) steps.push_back(c.steps);
        metrics_.generation(static_cast<std::int64_t>(r.text_tokens().size()), steps, r.tokens_per_forward);
      }
      serve::Event ev;
      ev.kind = serve::Event::Kind::kDone;
      ev.choice = choice;
      ev.status = s;
      channel->push(std::move(ev));
    };
    return batcher_.submit(std::move(br));
  }

  // The whole request is over (answered, failed, or its client gone): stop what still runs.
  void stop_generation(Job& job) {
    job.channel->abandoned = true;
    for (const auto& c : job.choices) batcher_.cancel(c.id);
  }

  // A commit event of a choice still running: its text delta. A choice whose text is complete (a
  // stop sequence, max_tokens) has its generation stopped if that canvas was not its last.
  serve::TextAssembler::Delta take(Job& job, const serve::Event& ev) {
    Choice& c = job.choices[ev.choice];
    if (c.first_commit == Clock::time_point{}) {
      c.first_commit = Clock::now();
      c.first_canvas_seconds = ev.seconds;
    }
    c.canvas_seconds += ev.seconds;
    const auto d = c.text->add(ev.tokens.data(), static_cast<int>(ev.tokens.size()), ev.stop_token, ev.last);
    if (d.finished) {
      c.done = true;
      ++job.done;
      if (!ev.last) batcher_.cancel(c.id);
    }
    return d;
  }

  // An event that ends the request with an error: a choice ended without its last canvas
  // (cancelled by a shutdown, or failed).
  static bool fails(const Job& job, const serve::Event& ev) {
    return ev.kind == serve::Event::Kind::kDone && !job.choices[ev.choice].done;
  }
  // An event that no longer matters: its choice's text is complete.
  static bool stale(const Job& job, const serve::Event& ev) { return job.choices[ev.choice].done; }

  void first_chunk(Job& job) {
    if (job.first_chunk) return;
    job.first_chunk = true;
    metrics_.first_chunk(seconds_since(job.arrived));
  }

  ApiError failure(const dg::Status& s) const {
    if (s.code() == dg::StatusCode::kCancelled) {
      return ApiError(503, draining_ ? "the server shut down before the request finished" : "the request was cancelled", "",
                      "cancelled");
    }
    return ApiError(500, "generation failed: " + s.message(), "", "internal_error");
  }

  // Without "stream": wait for the whole answer (every choice).
  void answer(Job& job, httplib::Response& res) {
    std::vector<serve::ResponseShape::Choice> results(job.choices.size());
    while (job.done < job.choices.size()) {
      auto ev = job.channel->pop(std::chrono::milliseconds(1000));
      if (!ev || ev->kind == serve::Event::Kind::kDraft || stale(job, *ev)) continue;
      if (fails(job, *ev)) {
        job.failed = true;
        send_error(res, failure(ev->status.ok() ? dg::Status(dg::StatusCode::kInternal, "no final canvas") : ev->status));
        return;
      }
      first_chunk(job);
      const auto d = take(job, *ev);
      if (d.finished) results[ev->choice] = job.result(ev->choice, d.finish_reason);
    }
    if (job.request.llama) {
      json list = json::array();
      for (std::size_t i = 0; i < results.size(); ++i) list.push_back(llama_answer(job, i, results[i].finish_reason, false));
      res.set_content(serve::dump_json(job.request.prompt_list ? list : list[0]), "application/json");
    } else {
      res.set_content(serve::dump_json(job.shape->answer(results, job.usage())), "application/json");
    }
    job.finished = true;
  }

  // llama.cpp's generation_settings: what this request ran with.
  json llama_settings(const serve::GenerationRequest& r, const Options& o, int max_tokens) const {
    const auto& s = o.sampler;
    return json{{"n_predict", max_tokens},
                {"seed", s.rng.seed},
                {"stop", r.stop},
                {"stream", r.stream},
                {"return_tokens", r.return_tokens},
                {"n_ctx", model_->config().max_position_embeddings},
                {"model", api_.model_id},
                {"dgemma", json{{"max_denoising_steps", s.max_denoising_steps},
                                {"t_min", s.schedule.t_min},
                                {"t_max", s.schedule.t_max},
                                {"entropy_bound", s.acceptance.entropy_bound},
                                {"stability_threshold", s.stopping.stability_threshold},
                                {"confidence_threshold", s.stopping.confidence_threshold}}}};
  }

  // One prompt's final object in llama.cpp's shape (its content and ids already sent in a stream).
  json llama_answer(const Job& job, std::size_t i, const char* reason, bool stream) const {
    const Choice& c = job.choices[i];
    serve::LlamaResult r;
    r.index = i;
    r.content = c.text->text();
    if (job.request.return_tokens) r.tokens = c.text->tokens();
    r.tokens_predicted = c.text->completion_tokens();
    r.tokens_evaluated = c.prompt_tokens;
    r.prompt = c.prompt_text;
    r.stopping_word = c.text->stopping_word();
    const bool limit = reason == nullptr || std::string(reason) == "length";
    r.stop_type = limit ? "limit" : r.stopping_word.empty() ? "eos" : "word";
    if (c.first_commit != Clock::time_point{}) {
      const double waited = std::chrono::duration<double>(c.first_commit - job.arrived).count();
      r.prompt_ms = 1e3 * std::max(0.0, waited - c.first_canvas_seconds);
    }
    r.predicted_ms = 1e3 * c.canvas_seconds;
    return serve::project_fields(serve::llama_final(r, c.settings, api_.model_id, stream), job.request.response_fields);
  }

  // llama.cpp's n_predict 0: every prompt checked, answered at once with no tokens.
  void answer_without_tokens(Job& job, httplib::Response& res) {
    const auto& cfg = model_->config();
    std::string body;
    json list = json::array();
    for (std::size_t i = 0; i < job.choices.size(); ++i) {
      if (job.choices[i].prompt_tokens > cfg.max_position_embeddings) {
        throw ApiError(400, "the prompt is " + std::to_string(job.choices[i].prompt_tokens) + " tokens, more than the " +
                                std::to_string(cfg.max_position_embeddings) + " positions of the model",
                       job.request.prompt_list ? "prompt[" + std::to_string(i) + "]" : "prompt", "context_length_exceeded");
      }
      const json one = llama_answer(job, i, "length", false);
      body += serve::sse_data(one);
      list.push_back(one);
    }
    res.set_header("X-Dgemma-Seed", std::to_string(job.request.seed));
    set_ignored_header(res, job.request.ignored);
    if (job.request.stream) {
      res.set_content(body, "text/event-stream");
    } else {
      res.set_content(serve::dump_json(job.request.prompt_list ? list : list[0]), "application/json");
    }
  }

  // One call of the stream's content provider: writes the next chunk (or a heartbeat). Returning
  // false ends the response; a failed write means that the client has gone.
  bool stream_some(Job& job, httplib::DataSink& sink) {
    const auto send = [&sink](const std::string& s) { return sink.write(s.data(), s.size()); };
    if (job.request.chat && !job.role_sent) {
      // OpenAI's first chunk of each choice: the role, no content (with n > 1, one per index, so
      // that a client that assembles each choice from its chunks finds its role).
      job.role_sent = true;
      std::string roles;
      for (std::size_t i = 0; i < job.choices.size(); ++i) {
        roles += serve::sse_data(job.shape->chunk("", nullptr, /*role=*/true, i));
      }
      return send(roles);
    }
    auto ev = job.channel->pop(config_.heartbeat);
    if (!ev) return send(serve::sse_comment("keep-alive"));
    if (stale(job, *ev)) return true;
    if (job.request.llama) return stream_llama(job, *ev, send, sink);
    if (ev->kind == serve::Event::Kind::kDraft) {
      json chunk = job.shape->empty_chunk(ev->choice);
      chunk["dgemma"] = json{{"draft", json{{"canvas", ev->canvas},
                                            {"step", ev->step},
                                            {"accepted", ev->accepted},
                                            {"text", decode(ev->tokens)},
                                            {"tokens", ev->tokens}}}};
      return send(serve::sse_data(chunk));
    }
    if (fails(job, *ev)) {
      // OpenAI streams an error object as a data event; its clients raise it.
      job.finished = true;
      job.failed = true;
      const bool ok = send(serve::sse_data(failure(ev->status.ok() ? dg::Status(dg::StatusCode::kInternal, "no final canvas")
                                                                  : ev->status)
                                               .body())) &&
                      send(serve::sse_done());
      sink.done();
      return ok;
    }
    first_chunk(job);
    const auto d = take(job, *ev);
    json chunk = job.shape->chunk(d.text, d.finished ? d.finish_reason : nullptr, false, ev->choice);
    chunk["dgemma"] = json{{"canvas", ev->canvas}, {"steps", ev->step}};
    if (job.done < job.choices.size()) return send(serve::sse_data(chunk));
    const json usage = job.usage();
    // With include_usage the usage travels in OpenAI's extra chunk only: clients that add up the
    // usage of every chunk (LangChain) would count it twice.
    if (!job.request.include_usage) chunk["usage"] = usage;
    job.finished = true;
    bool ok = send(serve::sse_data(chunk));
    if (ok && job.request.include_usage) ok = send(serve::sse_data(job.shape->usage_chunk(usage)));
    ok = ok && send(serve::sse_done());
    sink.done();
    return ok;
  }

  // llama.cpp's stream: a partial object per committed canvas (its text and ids), a final object
  // per prompt when its text is complete, and no [DONE] after the last.
  template <class Send>
  bool stream_llama(Job& job, const serve::Event& ev, const Send& send, httplib::DataSink& sink) {
    Choice& c = job.choices[ev.choice];
    if (ev.kind == serve::Event::Kind::kDraft) {
      json chunk = serve::llama_partial(ev.choice, "", {}, c.text->completion_tokens(), c.prompt_tokens);
      chunk["dgemma"] = json{{"draft", json{{"canvas", ev.canvas},
                                            {"step", ev.step},
                                            {"accepted", ev.accepted},
                                            {"text", decode(ev.tokens)},
                                            {"tokens", ev.tokens}}}};
      return send(serve::sse_data(chunk));
    }
    if (fails(job, ev)) {
      job.finished = true;
      job.failed = true;
      const bool ok = send(serve::sse_data(
          failure(ev.status.ok() ? dg::Status(dg::StatusCode::kInternal, "no final canvas") : ev.status).body()));
      sink.done();
      return ok;
    }
    first_chunk(job);
    const auto d = take(job, ev);
    const auto& all = c.text->tokens();
    const std::vector<std::int32_t> piece(all.begin() + static_cast<std::ptrdiff_t>(c.tokens_streamed), all.end());
    c.tokens_streamed = all.size();
    json chunk = serve::llama_partial(ev.choice, d.text, piece, c.text->completion_tokens(), c.prompt_tokens);
    chunk["dgemma"] = json{{"canvas", ev.canvas}, {"steps", ev.step}};
    bool ok = send(serve::sse_data(chunk));
    if (ok && d.finished) ok = send(serve::sse_data(llama_answer(job, ev.choice, d.finish_reason, true)));
    if (job.done == job.choices.size()) {
      job.finished = true;
      sink.done();
    }
    return ok;
  }

  // Called once per accepted request when its response is over, however it ended.
  void finish(Job& job) {
    // After a failure the other choices (n > 1, a llama.cpp prompt list) may still be running,
    // with nobody left to read them; a client gone leaves all of them running.
    if (!job.finished || job.failed) stop_generation(job);
    if (!job.finished && !job.failed) metrics_.disconnect();
    metrics_.latency(job.endpoint, seconds_since(job.arrived));
    {
      std::lock_guard<std::mutex> lock(registry_mu_);
      for (const auto& c : job.choices) registry_.erase(c.id);
    }
    --in_flight_;
  }

  std::shared_ptr<const dg::cpu::Model> model_;
  std::unique_ptr<dg::io::Tokenizer> tok_;
  dg::io::ChatOptions chat_options_;  // from the checkpoint's chat template (io::chat_options_for)
  Engine engine_;
  Batcher batcher_;
  Batcher::Limits limits_;
  ServeConfig config_;
  Options defaults_;
  serve::ApiLimits api_;
  std::int64_t created_;
  std::string id_prefix_;
  serve::Metrics metrics_;
  httplib::Server http_;
  std::thread worker_;
  std::atomic<bool> stop_worker_{false}, draining_{false}, force_{false}, listener_done_{false};
  std::atomic<int> in_flight_{0};
  std::atomic<std::uint64_t> request_counter_{0};
  std::mutex registry_mu_;
  std::map<Batcher::RequestId, std::shared_ptr<serve::Channel>> registry_;
  bool cancelled_all_ = false;  // guarded by registry_mu_: shutdown has cancelled what was registered
};

}  // namespace

int cmd_serve(const std::vector<std::string>& args) {
  std::vector<FlagSpec> specs = {
      {"model", "DIR", "checkpoint directory with tokenizer.json (default: the bundled model, models/dg-tiny-tasks)"},
      {"model-name", "NAME", "the model id clients send (default: the directory's name)"},
      {"host", "ADDR", "address to bind (default 127.0.0.1: loopback only)"},
      {"port", "N", "TCP port (default 8080; 0: any free port, printed at start)"},
      {"max-batch", "N", "requests denoised together at most (default 16)"},
      {"max-queue", "N", "accepted requests waiting for a slot at most; beyond: 429 (default 64)"},
      {"memory-budget", "MIB", "KV caches and workspace of all requests together, beyond the weights (default: no limit)"},
      {"api-key", "KEY", "require 'Authorization: Bearer KEY' on /v1/ (default: $DGEMMA_API_KEY, else none)"},
      {"max-body-bytes", "N", "largest request body accepted; beyond: 413 (default 1048576)"},
      {"http-threads", "N", "connections served at once (default: max-batch + max-queue + 8)"},
      {"shutdown-timeout", "S", "on SIGINT/SIGTERM, seconds that requests in flight get to finish (default 10)"},
      {"cors-origin", "ORIGIN", "let browser pages of this origin ('https://app.example' or '*') call the API (default: none)"},
      {"strict", "", "refuse unknown fields and sampling values the sampler cannot honour, as OpenAI does (default: ignore them, named in X-Dgemma-Ignored)"},
      {"check-weights", "", "scan every weight for NaN/Inf at load"},
  };
  for (auto& spec : engine_flag_specs(dg::cpu::precision_name(dg::cpu::EngineOptions{}.precision))) specs.push_back(spec);
  Flags f("serve",
          "Serves the model over an OpenAI-compatible HTTP API: POST /v1/chat/completions, POST /v1/completions,\n"
          "GET /v1/models, GET /health, GET /metrics; llama.cpp's POST /completion; POST /tokenize and /detokenize\n"
          "(docs/serving.md). SIGINT/SIGTERM drain and stop it.",
          specs);
  if (!f.parse(args)) {
    std::cout << f.usage();
    return 0;
  }
  ServeConfig config;
  config.host = f.str("host", config.host);
  config.port = static_cast<int>(f.integer("port", 8080, 0, 65535));
  Batcher::Limits limits;
  limits.max_batch = static_cast<int>(f.integer("max-batch", 16, 1, 4096));
  limits.max_queue = static_cast<std::size_t>(f.integer("max-queue", 64, 1, 1 << 20));
  limits.memory_budget_bytes = static_cast<std::size_t>(f.integer("memory-budget", 0, 0, 1 << 30)) << 20;
  const char* env_key = std::getenv("DGEMMA_API_KEY");
  config.api_key = f.str("api-key", env_key ? env_key : "");
  if (f.has("api-key") && config.api_key.empty()) throw UsageError("--api-key must not be empty");
  config.max_body_bytes = static_cast<std::size_t>(f.integer("max-body-bytes", 1 << 20, 1024, 1ll << 32));
  config.http_threads = static_cast<int>(f.integer(
      "http-threads", limits.max_batch + static_cast<std::int64_t>(limits.max_queue) + 8, 2, 4096));
  config.shutdown_timeout = f.number("shutdown-timeout", 10.0, 0.0, 3600.0);
  config.cors_origin = f.str("cors-origin");
  if (f.has("cors-origin") && config.cors_origin.empty()) throw UsageError("--cors-origin must not be empty");
  config.strict = f.flag("strict");
  const auto engine_options = dgemma::engine_options(f, dg::cpu::EngineOptions{}.precision);

  // SIGINT/SIGTERM go to one thread (blocked everywhere else, before any thread starts, the engines'
  // workers included); a write to a closed socket must fail with EPIPE rather than kill the server.
  std::signal(SIGPIPE, SIG_IGN);
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  std::atomic<Server*> server{nullptr};
  std::atomic<bool> done{false};
  std::thread signal_thread([&] {
    std::thread drain;  // shutdown() waits for requests in flight; a second signal must still be seen
    while (!done) {
      timespec wait{0, 200 * 1000 * 1000};
      const int sig = sigtimedwait(&signals, nullptr, &wait);
      if (sig <= 0) continue;
      Server* s = server.load();
      if (s == nullptr) std::_Exit(128 + sig);  // still loading: nothing to drain
      if (!drain.joinable()) {
        drain = std::thread([s] { s->shutdown(); });
      } else {
        s->force();  // a second signal: cancel what is left now
      }
    }
    if (drain.joinable()) drain.join();
  });
  // The signal thread (and a drain it started) must end before the Server it points to is destroyed.
  struct JoinOnExit {
    std::thread& t;
    std::atomic<bool>& done;
    void operator()() {
      done = true;
      if (t.joinable()) t.join();
    }
    ~JoinOnExit() { (*this)(); }
  } join_signal_thread{signal_thread, done};

  const std::string dir = f.str("model", DG_DEFAULT_MODEL_DIR);
  auto model = load_model(dir, f.flag("check-weights"));
  if (!model->config().is_diffusion()) throw UsageError(dir + " is not a DiffusionGemma checkpoint (model_type diffusion_gemma)");
  const std::string tok_path = dir + "/tokenizer.json";
  if (::access(tok_path.c_str(), F_OK) != 0) {
    throw dg::Error(dg::StatusCode::kNotFound, tok_path + " does not exist: the server needs the model's tokenizer");
  }
  auto tok = std::make_unique<dg::io::Tokenizer>(dg::io::Tokenizer::from_file(tok_path));
  std::string name = f.str("model-name");
  if (name.empty()) {
    std::string d = dir;
    while (d.size() > 1 && d.back() == '/') d.pop_back();
    const auto slash = d.rfind('/');
    name = slash == std::string::npos ? d : d.substr(slash + 1);
  }
  // The generation prompt ends as the checkpoint's own chat template ends it.
  const dg::io::ChatOptions chat_options = dg::io::chat_options_for(dir);
  auto s = std::make_unique<Server>(model, std::move(tok), chat_options, engine_options, limits, config, name);
  server = s.get();
  const bool listened = s->run();
  join_signal_thread();
  if (!listened) {
    throw dg::Error(dg::StatusCode::kIoError, "cannot listen on " + config.host + ":" + std::to_string(config.port) +
                                                  " (in use, or not an address of this machine)");
  }
  std::fprintf(stderr, "dgemma serve: stopped\n");
  return 0;
}

}  // namespace dgemma
