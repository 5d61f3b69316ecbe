// SPDX-License-Identifier: Apache-2.0
// ContinuousBatcher<Engine, Sampler, Scheduler>: many concurrent requests on one engine
// (docs/serving.md). Requests join and leave between passes: each step() admits queued requests
// while the batch and the memory budget allow, runs one batched encoder pass over every sequence
// that has tokens to append (prompts, committed canvases), then one batched denoising step over
// every sequence in a canvas. Each request keeps its own options, seed, limits and stop ids
// (runtime/sequence.hpp), so its tokens are the ones it would get alone.
//
// Threads: submit(), cancel(), stats() and wait_for_work() may be called from any thread; step()
// runs on one thread (the one that owns the engine), and every callback runs there.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <new>
#include <string>
#include <unordered_set>
#include <utility>
#include <vector>

#include <diffusion_gemma/core/status.hpp>
#include <diffusion_gemma/runtime/engine_traits.hpp>
#include <diffusion_gemma/runtime/sequence.hpp>
#include <diffusion_gemma/sampler/sampler.hpp>
#include <diffusion_gemma/schedule/canvas_scheduler.hpp>

namespace diffusion_gemma {

template <class Engine_, class Sampler_ = ReferenceSampler, class Scheduler_ = CanvasScheduler<>>
class ContinuousBatcher {
  static_assert(check_batched_engine<Engine_>(), "see runtime/engine_traits.hpp");
  static_assert(check_decoder_policies<Sampler_, Scheduler_>(), "see docs/policies.md");

 public:
  using Engine = Engine_;
  using Sampler = Sampler_;
  using Scheduler = Scheduler_;
  using Options = DecodeOptions<Sampler, Scheduler>;
  using RequestId = std::uint64_t;

  struct Limits {
    int max_batch = 16;                   // sequences in one pass
    std::size_t memory_budget_bytes = 0;  // KV caches + workspace of the running requests; 0: no limit
    std::size_t max_queue = 256;          // requests waiting for admission
  };

  struct Request {
    std::vector<std::int32_t> prompt;
    Options options;
    Callbacks callbacks;  // run on the step() thread; returning false cancels the request
    // Called exactly once per accepted request, on the step() thread: Status kCancelled when it
    // was cancelled, the error when a pass failed.
    std::function<void(const GenerationResult&, const Status&)> on_done;
  };

  struct Stats {
    std::size_t queued = 0, active = 0, bytes_in_use = 0;
    int last_batch = 0;               // sequences in the last denoising pass
    std::uint64_t passes = 0;         // batched passes run (encoder and denoiser)
    std::uint64_t denoise_passes = 0; // of which denoising steps
    std::uint64_t denoise_rows = 0;   // canvas positions denoised
    std::uint64_t denoise_steps = 0;  // sequence-steps (a pass over 4 sequences counts 4)
    std::uint64_t completed = 0, cancelled = 0, failed = 0;
  };

  ContinuousBatcher(Engine& engine, Limits limits) : engine_(engine), limits_(limits) {
    if (limits_.max_batch <= 0) throw_error(StatusCode::kInvalidArgument, "ContinuousBatcher: max_batch must be positive");
  }

  // Checks the request at once (options, token ids, positions, budget) and queues it. Throws
  // Error: kInvalidArgument / kOutOfRange for a request that can never run, kUnavailable when the
  // queue is full.
  RequestId submit(Request r) {
    auto seq = std::make_unique<Seq>(engine_, std::move(r.prompt), r.options, std::move(r.callbacks));
    if (limits_.memory_budget_bytes > 0 && seq->bytes() > limits_.memory_budget_bytes) {
      throw_error(StatusCode::kOutOfRange, "the request needs ", static_cast<double>(seq->bytes()) / (1 << 20),
                  " MiB (KV cache and workspace) but the memory budget is ",
                  static_cast<double>(limits_.memory_budget_bytes) / (1 << 20), " MiB");
    }
    std::lock_guard<std::mutex> lock(mu_);
    if (queue_.size() >= limits_.max_queue) {
      throw_error(StatusCode::kUnavailable, "the request queue is full (", limits_.max_queue, " waiting); retry later");
    }
    const RequestId id = next_id_++;
    queue_.push_back(Entry{id, std::move(seq), typename Engine::DenoiseState{}, std::move(r.on_done)});
    stats_.queued = queue_.size();
    cv_.notify_all();
    return id;
  }

  // Takes effect before the next pass: the request's memory is freed and on_done gets kCancelled.
  void cancel(RequestId id) {
    std::lock_guard<std::mutex> lock(mu_);
    cancels_.insert(id);
    cv_.notify_all();
  }

  // Blocks until there is something to do (a request waits or runs, or a cancel) or the timeout.
  void wait_for_work(std::chrono::milliseconds timeout) {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait_for(lock, timeout, [&] { return !queue_.empty() || !cancels_.empty() || running_ > 0 || stopping_; });
  }

  // Wakes wait_for_work() (for a server shutting down).
  void interrupt() {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
    cv_.notify_all();
  }

  Stats stats() const {
    std::lock_guard<std::mutex> lock(mu_);
    return stats_;
  }

  // One iteration; false when there was nothing to do.
  bool step() {
    std::vector<Entry> done;
    apply_cancels(done);
    retire(done);  // a cancelled request's slot and budget go to the queue in this same step
    admit(done);
    if (active_.empty()) {
      finish(done);
      return !done.empty();
    }
    encode_pass(done);
    denoise_pass(done);
    retire(done);
    finish(done);
    return true;
  }

 private:
  using Seq = Sequence<Engine, Sampler, Scheduler>;
  using Work = typename Seq::Work;

  struct Entry {
    RequestId id = 0;
    std::unique_ptr<Seq> seq;
    typename Engine::DenoiseState state{};
    std::function<void(const GenerationResult&, const Status&)> on_done;
    Status status{};
  };

  void apply_cancels(std::vector<Entry>& done) {
    std::lock_guard<std::mutex> lock(mu_);
    if (cancels_.empty()) return;
    for (auto it = queue_.begin(); it != queue_.end();) {
      if (cancels_.count(it->id)) {
        it->seq->cancel();
        it->status = Status(StatusCode::kCancelled, "cancelled");
        done.push_back(std::move(*it));
        it = queue_.erase(it);
      } else {
        ++it;
      }
    }
    for (auto& e : active_) {
      if (cancels_.count(e.id)) {
        e.seq->cancel();
        e.status = Status(StatusCode::kCancelled, "cancelled");
      }
    }
    cancels_.clear();  // ids not found are finished already (or never existed)
    stats_.queued = queue_.size();
  }

  // Moves requests from the queue while they fit. Each KV cache is allocated outside the lock (a
  // large one takes a while, and submit/cancel must not wait for it); a request whose allocation
  // fails ends with that error and takes no budget.
  void admit(std::vector<Entry>& done) {
    for (;;) {
      Entry next;
      {
        std::lock_guard<std::mutex> lock(mu_);
        if (queue_.empty() || static_cast<int>(active_.size()) >= limits_.max_batch) break;
        const std::size_t need = queue_.front().seq->bytes();
        if (limits_.memory_budget_bytes > 0 && bytes_in_use_ + need > limits_.memory_budget_bytes) break;
        next = std::move(queue_.front());
        queue_.pop_front();
        stats_.queued = queue_.size();
      }
      try {
        next.seq->start(engine_);
      } catch (const std::exception& err) {
        next.seq->cancel();
        next.status = status_of(err, "allocating the request's KV cache");
        done.push_back(std::move(next));
        continue;
      }
      bytes_in_use_ += next.seq->bytes();
      active_.push_back(std::move(next));
    }
    std::lock_guard<std::mutex> lock(mu_);
    running_ = active_.size();
    stats_.queued = queue_.size();
    stats_.active = active_.size();
    stats_.bytes_in_use = bytes_in_use_;
  }

  // A pass failed: every sequence in it ends with the error (the engine checks its inputs before
  // any work, so the others' caches are as they were; they are ended anyway, not retried).
  void fail(const std::vector<std::size_t>& members, const Status& st) {
    for (std::size_t i : members) {
      active_[i].seq->cancel();
      active_[i].status = st;
    }
  }

  // What an exception from the engine or a sequence means for the request: an Error keeps its
  // code; running out of memory (a pass's buffers grow with the batch and the caches) is
  // kOutOfMemory; anything else is internal.
  static Status status_of(const std::exception& err, const char* during) {
    if (const auto* e = dynamic_cast<const Error*>(&err)) return Status(e->code(), e->what());
    if (dynamic_cast<const std::bad_alloc*>(&err) != nullptr) {
      return Status(StatusCode::kOutOfMemory, std::string("out of memory ") + during);
    }
    return Status(StatusCode::kInternal, std::string(during) + ": " + err.what());
  }

  // Runs one request's own part of a pass; a throw ends that request alone.
  template <class F>
  bool guarded(Entry& e, const char* during, F&& f) {
    try {
      f();
      return true;
    } catch (const std::exception& err) {
      e.seq->cancel();
      e.status = status_of(err, during);
      return false;
    }
  }

  void encode_pass(std::vector<Entry>&) {
    std::vector<EncodeItem<typename Engine::Cache>> items;
    std::vector<std::size_t> members;
    for (std::size_t i = 0; i < active_.size(); ++i) {
      if (active_[i].seq->work() != Work::kEncode) continue;
      items.push_back(active_[i].seq->encode_item());
      members.push_back(i);
    }
    if (items.empty()) return;
    try {
      engine_.encode_batch(items.data(), items.size());
    } catch (const std::exception& err) {
      fail(members, status_of(err, "in a batched encoder pass"));
      return;
    }
    count_pass(0, 0, 0);
    for (std::size_t i : members) guarded(active_[i], "after a pass", [&] { active_[i].seq->encoded(); });
  }

  void denoise_pass(std::vector<Entry>&) {
    std::vector<DenoiseItem<typename Engine::Cache, typename Engine::DenoiseState>> items;
    std::vector<std::size_t> members;
    std::uint64_t rows = 0;
    for (std::size_t i = 0; i < active_.size(); ++i) {
      if (active_[i].seq->work() != Work::kDenoise) continue;
      // A request whose own options fail here (its Schedule's temperature) ends alone.
      if (!guarded(active_[i], "before a pass",
                   [&] { items.push_back(active_[i].seq->denoise_item(&active_[i].state)); })) {
        continue;
      }
      rows += static_cast<std::uint64_t>(items.back().n);
      members.push_back(i);
    }
    if (items.empty()) return;
    try {
      engine_.denoise_step_batch(items.data(), items.size());
    } catch (const std::exception& err) {
      fail(members, status_of(err, "in a batched denoising pass"));
      return;
    }
    count_pass(static_cast<int>(items.size()), rows, items.size());
    for (std::size_t i : members) guarded(active_[i], "after a pass", [&] { active_[i].seq->denoised(); });
  }

  void count_pass(int batch, std::uint64_t rows, std::uint64_t steps) {
    std::lock_guard<std::mutex> lock(mu_);
    ++stats_.passes;
    if (batch > 0) {
      stats_.last_batch = batch;
      ++stats_.denoise_passes;
    }
    stats_.denoise_rows += rows;
    stats_.denoise_steps += steps;
  }

  void retire(std::vector<Entry>& done) {
    std::vector<Entry> keep;
    for (auto& e : active_) {
      if (e.seq->work() == Work::kDone) {
        bytes_in_use_ -= e.seq->bytes();
        if (e.status.ok() && e.seq->cancelled()) e.status = Status(StatusCode::kCancelled, "cancelled by a callback");
        done.push_back(std::move(e));
      } else {
        keep.push_back(std::move(e));
      }
    }
    active_.swap(keep);
    std::lock_guard<std::mutex> lock(mu_);
    running_ = active_.size();
    stats_.active = active_.size();
    stats_.bytes_in_use = bytes_in_use_;
  }

  // on_done outside the lock: a callback may submit or cancel. Every request gets its on_done
  // even when an earlier one throws; the first exception is rethrown after the last call.
  void finish(std::vector<Entry>& done) {
    std::exception_ptr first;
    for (auto& e : done) {
      {
        std::lock_guard<std::mutex> lock(mu_);
        if (e.status.ok()) {
          ++stats_.completed;
        } else if (e.status.code() == StatusCode::kCancelled) {
          ++stats_.cancelled;
        } else {
          ++stats_.failed;
        }
      }
      try {
        if (e.on_done) e.on_done(e.seq->result(), e.status);
      } catch (...) {
        if (!first) first = std::current_exception();
      }
    }
    done.clear();
    if (first) std::rethrow_exception(first);
  }

  Engine& engine_;
  Limits limits_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Entry> queue_;               // guarded by mu_
  std::unordered_set<RequestId> cancels_;  // guarded by mu_
  std::size_t running_ = 0;               // guarded by mu_
  bool stopping_ = false;                 // guarded by mu_
  RequestId next_id_ = 1;                 // guarded by mu_
  Stats stats_;                           // guarded by mu_
  std::vector<Entry> active_;             // step() thread only
  std::size_t bytes_in_use_ = 0;          // step() thread only
};

}  // namespace diffusion_gemma
