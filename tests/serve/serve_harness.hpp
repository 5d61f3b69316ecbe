// SPDX-License-Identifier: Apache-2.0
// What the `dgemma serve` tests share: starting the server as a child process on a free loopback
// port, an HTTP client that can read a stream chunk by chunk (and hang up mid-stream), SSE
// parsing, and the server's resident memory from /proc.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <mutex>
#include <regex>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <httplib.h>
#include <nlohmann/json.hpp>

namespace serve_test {

using json = nlohmann::json;

inline int failures = 0;
#define CHECK(cond, what)                                                               \
  do {                                                                                  \
    if (!(cond)) {                                                                      \
      ++serve_test::failures;                                                           \
      std::fprintf(stderr, "FAILED %s:%d: %s\n  %s\n", __FILE__, __LINE__, #cond,       \
                   std::string(what).c_str());                                          \
    }                                                                                   \
  } while (0)

// `dgemma serve ... --port 0` as a child; the port comes from its "listening on" line.
class ServerProcess {
 public:
  ServerProcess(const std::string& dgemma, std::vector<std::string> args) {
    int fds[2];
    if (::pipe(fds) != 0) throw std::runtime_error("pipe failed");
    pid_ = ::fork();
    if (pid_ == 0) {
      ::dup2(fds[1], 2);
      ::close(fds[0]);
      ::close(fds[1]);
      std::vector<std::string> all = {dgemma, "serve", "--host", "127.0.0.1", "--port", "0"};
      all.insert(all.end(), args.begin(), args.end());
      std::vector<char*> argv;
      for (auto& a : all) argv.push_back(a.data());
      argv.push_back(nullptr);
      ::execv(dgemma.c_str(), argv.data());
      std::perror("execv");
      std::_Exit(127);
    }
    ::close(fds[1]);
    reader_ = std::thread([this, fd = fds[0]] {
      char buf[4096];
      ssize_t n;
      while ((n = ::read(fd, buf, sizeof buf)) > 0) {
        std::lock_guard<std::mutex> lock(mu_);
        log_.append(buf, static_cast<std::size_t>(n));
      }
      ::close(fd);
    });
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
    const std::regex listening("listening on http://127\\.0\\.0\\.1:([0-9]+)");
    while (std::chrono::steady_clock::now() < deadline) {
      {
        std::lock_guard<std::mutex> lock(mu_);
        std::smatch m;
        if (std::regex_search(log_, m, listening)) {
          port_ = std::stoi(m[1]);
          break;
        }
      }
      int status = 0;
      if (::waitpid(pid_, &status, WNOHANG) == pid_) {
        pid_ = -1;
        throw std::runtime_error("dgemma serve exited at start:\n" + log());
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    if (port_ == 0) throw std::runtime_error("dgemma serve did not start listening:\n" + log());
  }
  ~ServerProcess() {
    if (pid_ > 0) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
    }
    if (reader_.joinable()) reader_.join();
  }

  int port() const { return port_; }
  int pid() const { return pid_; }
  std::string log() const {
    std::lock_guard<std::mutex> lock(mu_);
    return log_;
  }

  // SIGTERM, then the exit code (or -1 if it did not exit within `seconds`).
  int terminate(double seconds) {
    ::kill(pid_, SIGTERM);
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
    while (std::chrono::steady_clock::now() < deadline) {
      int status = 0;
      if (::waitpid(pid_, &status, WNOHANG) == pid_) {
        pid_ = -1;
        return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return -1;
  }

  // Resident set size in KiB (VmRSS of /proc/PID/status).
  long rss_kib() const {
    std::ifstream in("/proc/" + std::to_string(pid_) + "/status");
    std::string line;
    while (std::getline(in, line)) {
      if (line.rfind("VmRSS:", 0) == 0) return std::stol(line.substr(6));
    }
    return -1;
  }

 private:
  pid_t pid_ = -1;
  int port_ = 0;
  std::thread reader_;
  mutable std::mutex mu_;
  std::string log_;
};

struct Reply {
  int status = 0;       // 0: no response (connection failed or we hung up)
  std::string body;
  std::vector<json> events;  // SSE data events, in order ([DONE] excluded)
  bool done = false;         // saw data: [DONE]
  bool comments = false;     // saw a ": ..." comment line
  std::string error;         // the client's error when status is 0
  httplib::Headers headers;  // the response's headers
};

// Splits an SSE body into its data events.
inline void parse_sse(const std::string& text, Reply& r) {
  std::size_t pos = 0;
  while (pos < text.size()) {
    const std::size_t end = text.find("\n\n", pos);
    if (end == std::string::npos) break;
    const std::string event = text.substr(pos, end - pos);
    pos = end + 2;
    if (event.rfind(": ", 0) == 0) {
      r.comments = true;
    } else if (event == "data: [DONE]") {
      r.done = true;
    } else if (event.rfind("data: ", 0) == 0) {
      r.events.push_back(json::parse(event.substr(6)));
    } else {
      r.events.push_back(json{{"unparsed", event}});
    }
  }
}

// POST with a body; with `hang_up_after` > 0 the client closes the connection after that many
// bytes of the response body (a client that goes away mid-stream).
inline Reply post(int port, const std::string& path, const std::string& body, const std::string& api_key = "",
                  std::size_t hang_up_after = 0, const std::string& authorization = "") {
  httplib::Client cli("127.0.0.1", port);
  cli.set_read_timeout(120, 0);
  cli.set_write_timeout(30, 0);
  httplib::Request req;
  req.method = "POST";
  req.path = path;
  req.body = body;
  req.set_header("Content-Type", "application/json");
  if (!api_key.empty()) req.set_header("Authorization", "Bearer " + api_key);
  if (!authorization.empty()) req.set_header("Authorization", authorization);
  std::string received;
  req.content_receiver = [&](const char* data, std::size_t n, std::uint64_t, std::uint64_t) {
    received.append(data, n);
    return hang_up_after == 0 || received.size() < hang_up_after;
  };
  httplib::Response res;
  httplib::Error err = httplib::Error::Success;
  Reply r;
  if (cli.send(req, res, err)) {
    r.status = res.status;
    r.headers = res.headers;
  } else {
    r.error = httplib::to_string(err);
  }
  r.body = received;
  if (r.status == 200 && res.get_header_value("Content-Type").rfind("text/event-stream", 0) == 0) parse_sse(received, r);
  return r;
}

inline Reply get(int port, const std::string& path, const std::string& api_key = "") {
  httplib::Client cli("127.0.0.1", port);
  cli.set_read_timeout(30, 0);
  httplib::Headers h;
  if (!api_key.empty()) h.emplace("Authorization", "Bearer " + api_key);
  Reply r;
  if (auto res = cli.Get(path.c_str(), h)) {
    r.status = res->status;
    r.body = res->body;
    r.headers = res->headers;
  }
  return r;
}

// A response header's value ("" when absent).
inline std::string header(const Reply& r, const std::string& name) {
  const auto it = r.headers.find(name);
  return it == r.headers.end() ? std::string() : it->second;
}

// The text of a stream: its content deltas (chat) or text pieces (completions), drafts excluded.
inline std::string stream_text(const Reply& r) {
  std::string text;
  for (const auto& e : r.events) {
    if (!e.contains("choices")) continue;
    for (const auto& c : e["choices"]) {
      if (c.contains("delta") && c["delta"].contains("content") && c["delta"]["content"].is_string()) {
        text += c["delta"]["content"].get<std::string>();
      }
      if (c.contains("text") && c["text"].is_string()) text += c["text"].get<std::string>();
    }
  }
  return text;
}

// finish_reason of the stream's last choice that has one ("" if none).
inline std::string stream_finish(const Reply& r) {
  std::string finish;
  for (const auto& e : r.events) {
    if (!e.contains("choices")) continue;
    for (const auto& c : e["choices"]) {
      if (c.contains("finish_reason") && c["finish_reason"].is_string()) finish = c["finish_reason"].get<std::string>();
    }
  }
  return finish;
}

inline json stream_usage(const Reply& r) {
  json usage;
  for (const auto& e : r.events) {
    if (e.contains("usage") && !e["usage"].is_null()) usage = e["usage"];
  }
  return usage;
}

// A metric's value from /metrics text (the first sample line that starts with `series`).
inline double metric(const std::string& text, const std::string& series) {
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(series + " ", 0) == 0) return std::stod(line.substr(series.size() + 1));
  }
  return -1;
}

}  // namespace serve_test
