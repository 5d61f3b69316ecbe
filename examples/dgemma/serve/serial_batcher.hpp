// SPDX-License-Identifier: Apache-2.0
// TEMPORARY stand-in with the interface of runtime/batcher.hpp's ContinuousBatcher, so that the
// server can be built and tested before the batcher lands: it runs one request at a time with a
// Decoder. Removed when the real batcher is merged.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <set>
#include <utility>
#include <vector>

#include <diffusion_gemma/runtime/decoder.hpp>

namespace dgemma::serve {

template <class Engine>
class SerialBatcher {
 public:
  using Decoder = diffusion_gemma::Decoder<Engine>;
  using Options = typename Decoder::Options;
  using RequestId = std::uint64_t;
  struct Limits {
    int max_batch = 16;
    std::size_t memory_budget_bytes = 0;
    std::size_t max_queue = 256;
  };
  struct Request {
    std::vector<std::int32_t> prompt;
    Options options;
    diffusion_gemma::Callbacks callbacks;
    std::function<void(const diffusion_gemma::GenerationResult&, const diffusion_gemma::Status&)> on_done;
  };
  struct Stats {
    std::size_t queued = 0, active = 0, bytes_in_use = 0;
    int last_batch = 0;
    std::uint64_t passes = 0, denoise_rows = 0;
  };

  SerialBatcher(Engine& engine, Limits limits) : decoder_(engine), limits_(limits) {}

  RequestId submit(Request r) {
    Options o = r.options;
    if (limits_.memory_budget_bytes && (o.memory_budget_bytes == 0 || o.memory_budget_bytes > limits_.memory_budget_bytes)) {
      o.memory_budget_bytes = limits_.memory_budget_bytes;
    }
    (void)decoder_.plan(static_cast<std::int64_t>(r.prompt.size()), o);
    std::lock_guard<std::mutex> lock(mu_);
    if (queue_.size() >= limits_.max_queue) {
      diffusion_gemma::throw_error(diffusion_gemma::StatusCode::kOutOfRange, "the request queue is full (",
                                   limits_.max_queue, " waiting)");
    }
    const RequestId id = ++next_;
    queue_.emplace_back(id, std::move(r));
    cv_.notify_all();
    return id;
  }

  void cancel(RequestId id) {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto it = queue_.begin(); it != queue_.end(); ++it) {
      if (it->first == id) {
        cancelled_.push_back(std::move(*it));
        queue_.erase(it);
        cv_.notify_all();
        return;
      }
    }
    if (id == running_) cancel_running_ = true;
  }

  bool step() {
    std::unique_lock<std::mutex> lock(mu_);
    std::vector<std::pair<RequestId, Request>> cancelled(std::make_move_iterator(cancelled_.begin()),
                                                         std::make_move_iterator(cancelled_.end()));
    cancelled_.clear();
    if (queue_.empty()) {
      lock.unlock();
      for (auto& c : cancelled) finish_cancelled(c.second);
      return !cancelled.empty();
    }
    auto job = std::move(queue_.front());
    queue_.pop_front();
    running_ = job.first;
    cancel_running_ = false;
    lock.unlock();
    for (auto& c : cancelled) finish_cancelled(c.second);
    Request& r = job.second;
    diffusion_gemma::Callbacks cb;
    cb.on_step = [&](const diffusion_gemma::StepEvent& e) {
      ++passes_;
      ++denoise_rows_;
      return !cancel_running_.load() && (!r.callbacks.on_step || r.callbacks.on_step(e));
    };
    cb.on_commit = [&](const diffusion_gemma::CommitEvent& e) {
      return !cancel_running_.load() && (!r.callbacks.on_commit || r.callbacks.on_commit(e));
    };
    diffusion_gemma::GenerationResult result;
    diffusion_gemma::Status status;
    try {
      result = decoder_.generate(r.prompt, r.options, cb);
      if (result.finish == diffusion_gemma::Finish::kCancelled) status = {diffusion_gemma::StatusCode::kCancelled, "cancelled"};
    } catch (const diffusion_gemma::Error& e) {
      status = {e.code(), e.what()};
    }
    running_ = 0;
    if (r.on_done) r.on_done(result, status);
    return true;
  }

  void wait_for_work(std::chrono::milliseconds timeout) {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait_for(lock, timeout, [&] { return !queue_.empty() || !cancelled_.empty(); });
  }

  Stats stats() const {
    std::lock_guard<std::mutex> lock(mu_);
    Stats s;
    s.queued = queue_.size();
    s.active = running_ ? 1 : 0;
    s.last_batch = running_ ? 1 : 0;
    s.passes = passes_;
    s.denoise_rows = denoise_rows_;
    return s;
  }

 private:
  static void finish_cancelled(Request& r) {
    diffusion_gemma::GenerationResult result;
    result.finish = diffusion_gemma::Finish::kCancelled;
    if (r.on_done) r.on_done(result, {diffusion_gemma::StatusCode::kCancelled, "cancelled"});
  }
  Decoder decoder_;
  Limits limits_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::pair<RequestId, Request>> queue_, cancelled_;
  std::atomic<RequestId> running_{0};
  std::atomic<bool> cancel_running_{false};
  std::atomic<std::uint64_t> passes_{0}, denoise_rows_{0};
  RequestId next_ = 0;
};

}  // namespace dgemma::serve
