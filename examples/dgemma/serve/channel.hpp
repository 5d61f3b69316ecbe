// SPDX-License-Identifier: Apache-2.0
// The per-request channel between the worker thread (which runs the batcher and its callbacks)
// and the HTTP handler thread that owns the connection. The worker only pushes and never waits on
// a client; the handler waits here, so a slow or vanished client cannot stall the batch.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <mutex>
#include <optional>
#include <vector>

#include <diffusion_gemma/core/status.hpp>

namespace dgemma::serve {

struct Event {
  enum class Kind { kDraft, kCommit, kDone };
  Kind kind = Kind::kDone;
  std::size_t choice = 0;  // which of the request's sequences (a list of prompts shares one channel)
  int canvas = 0;
  int step = 0;       // draft: 0-based step; commit: steps the canvas took
  int accepted = 0;   // draft: positions that kept their sampled candidate
  std::vector<std::int32_t> tokens;  // draft: the argmax canvas; commit: its valid tokens
  bool stop_token = false;           // commit: the canvas ended on a stop id
  bool last = false;                 // commit: the request's last canvas
  double seconds = 0.0;              // commit: the canvas's denoising and commit, wall time
  diffusion_gemma::Status status;    // done: kOk, kCancelled or the error that ended it
};

class Channel {
 public:
  void push(Event e) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      events_.push_back(std::move(e));
    }
    cv_.notify_one();
  }

  // The next event, or nothing after `timeout`.
  std::optional<Event> pop(std::chrono::milliseconds timeout) {
    std::unique_lock<std::mutex> lock(mu_);
    if (!cv_.wait_for(lock, timeout, [&] { return !events_.empty(); })) return std::nullopt;
    Event e = std::move(events_.front());
    events_.pop_front();
    return e;
  }

  // Set by the handler when it no longer wants events (client gone, stop sequence, max_tokens):
  // the worker's callbacks then return false, which cancels the request before its next step.
  std::atomic<bool> abandoned{false};

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Event> events_;
};

}  // namespace dgemma::serve
