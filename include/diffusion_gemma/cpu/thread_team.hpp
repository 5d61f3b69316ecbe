// SPDX-License-Identifier: Apache-2.0
// The worker threads of the CPU back-end's parallel regions (parallel.hpp). Each thread that opens
// a region owns a team: workers started on first use and joined when that thread ends, so engines
// driven from different threads never share or wait for each other's workers.
//
// Why our own threads rather than OpenMP's: a pass opens dozens of short regions back to back, and
// under OMP_WAIT_POLICY=PASSIVE (common where cores are shared, and what our benchmarks set for
// both sides) each one woke a sleeping thread, which on a virtual machine means a halted virtual
// CPU and an interrupt through the hypervisor. A worker here spins for kSpinWindow after its
// share, yielding as it goes so that an oversubscribed machine (ctest -j, a valgrind run) still
// makes progress, and only then sleeps; the next region of the same pass finds it awake. Nothing
// here reads or changes process-wide settings.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <mutex>
#include <thread>
#include <vector>

namespace diffusion_gemma::cpu {

namespace detail {

// Where the calling thread is: its index in the region it runs (0 outside one, and on the thread
// that opened it) and whether it is inside one (a nested region then runs serially).
struct RegionPlace {
  int index = 0;
  bool inside = false;
};

inline RegionPlace& region_place() {
  thread_local RegionPlace place;
  return place;
}

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

}  // namespace detail

class ThreadTeam {
 public:
  // How long an idle worker stays awake for the next region. Regions of one pass follow each other
  // within microseconds; the gaps between passes (sampling, a scheduler's bookkeeping) are longer
  // and let the workers sleep.
  static constexpr std::chrono::microseconds kSpinWindow{250};

  ThreadTeam() = default;
  ThreadTeam(const ThreadTeam&) = delete;
  ThreadTeam& operator=(const ThreadTeam&) = delete;
  ~ThreadTeam() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stop_.store(true, std::memory_order_relaxed);
      ticket_.fetch_add(kTicketStep, std::memory_order_release);
    }
    wake_.notify_all();
    for (auto& w : workers_) w.join();
  }

  // The team of the calling thread.
  static ThreadTeam& of_this_thread() {
    thread_local ThreadTeam team;
    return team;
  }

  // Runs body(i) for i in [0, threads): i = 0 on the calling thread, the others on workers.
  // Returns once every call has returned, rethrowing the first exception any of them threw.
  template <class Body>
  void run(int threads, Body& body) {
    if (threads <= 1) {
      body(0);
      return;
    }
    const int helpers = threads - 1 < kMaxHelpers ? threads - 1 : kMaxHelpers;
    start_workers(helpers);
    job_ = [](void* b, int i) { (*static_cast<Body*>(b))(i); };
    body_ = &body;
    error_ = nullptr;
    pending_.store(helpers, std::memory_order_relaxed);
    {
      // The ticket carries the helper count, so a worker learns from one load whether the region
      // is its own; the others never read job_, which the next region may be rewriting.
      std::lock_guard<std::mutex> lock(mutex_);
      const std::uint64_t next = (ticket_.load(std::memory_order_relaxed) / kTicketStep + 1) * kTicketStep;
      ticket_.store(next + static_cast<std::uint64_t>(helpers), std::memory_order_release);
      if (sleepers_ > 0) wake_.notify_all();
    }
    std::exception_ptr own;
    try {
      enter(0, [&] { body(0); });
    } catch (...) {
      own = std::current_exception();
    }
    // The workers hold references into the caller's frame until they are done, even when the
    // caller's own share threw.
    for (unsigned spins = 0; pending_.load(std::memory_order_acquire) != 0; ++spins) {
      detail::cpu_relax();
      if ((spins & 63u) == 63u) std::this_thread::yield();
    }
    if (own) std::rethrow_exception(own);
    if (error_) std::rethrow_exception(error_);
  }

 private:
  static constexpr std::uint64_t kTicketStep = 1u << 16;
  static constexpr int kMaxHelpers = static_cast<int>(kTicketStep) - 1;

  template <class F>
  static void enter(int index, F&& f) {
    auto& place = detail::region_place();
    const RegionGuard guard(place, index);
    f();
  }

  struct RegionGuard {
    detail::RegionPlace& place;
    detail::RegionPlace saved;
    RegionGuard(detail::RegionPlace& p, int index) : place(p), saved(p) { place = {index, true}; }
    ~RegionGuard() { place = saved; }
  };

  void start_workers(int helpers) {
    while (static_cast<int>(workers_.size()) < helpers) {
      const int index = static_cast<int>(workers_.size()) + 1;
      const std::uint64_t seen = ticket_.load(std::memory_order_relaxed);
      workers_.emplace_back([this, index, seen] { work(index, seen); });
    }
  }

  void work(int index, std::uint64_t seen) {
    for (;;) {
      seen = next_ticket(seen);
      if (stop_.load(std::memory_order_relaxed)) return;
      if (static_cast<int>(seen % kTicketStep) < index) continue;  // a region with fewer helpers
      try {
        enter(index, [&] { job_(body_, index); });
      } catch (...) {
        std::lock_guard<std::mutex> lock(mutex_);
        if (!error_) error_ = std::current_exception();
      }
      pending_.fetch_sub(1, std::memory_order_acq_rel);
    }
  }

  // Waits for a ticket other than `seen`: spinning for kSpinWindow, then asleep.
  std::uint64_t next_ticket(std::uint64_t seen) {
    const auto start = std::chrono::steady_clock::now();
    for (unsigned spins = 1;; ++spins) {
      const std::uint64_t t = ticket_.load(std::memory_order_acquire);
      if (t != seen) return t;
      detail::cpu_relax();
      if ((spins & 63u) == 0u) {
        if (std::chrono::steady_clock::now() - start > kSpinWindow) break;
        std::this_thread::yield();
      }
    }
    std::unique_lock<std::mutex> lock(mutex_);
    ++sleepers_;
    wake_.wait(lock, [&] { return ticket_.load(std::memory_order_relaxed) != seen; });
    --sleepers_;
    return ticket_.load(std::memory_order_acquire);
  }

  std::vector<std::thread> workers_;
  std::mutex mutex_;
  std::condition_variable wake_;
  int sleepers_ = 0;                       // guarded by mutex_
  std::atomic<std::uint64_t> ticket_{0};   // region number x kTicketStep + its helper count
  std::atomic<int> pending_{0};            // helpers of the current region not yet done
  std::atomic<bool> stop_{false};
  void (*job_)(void*, int) = nullptr;      // the current region, written before its ticket
  void* body_ = nullptr;
  std::exception_ptr error_;               // the first exception a helper threw (guarded by mutex_)
};

}  // namespace diffusion_gemma::cpu
