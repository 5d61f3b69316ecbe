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
// here reads or changes process-wide settings; the one process-wide thing is a fork handler that
// counts forks, so that a forked child starts its own workers instead of waiting on its parent's.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <system_error>
#include <thread>
#include <vector>

#if defined(__unix__) || defined(__APPLE__)
#include <pthread.h>
#endif
#if defined(__linux__)
#include <sched.h>
#endif

namespace diffusion_gemma::cpu {

namespace detail {

// The CPUs this process may run on (its affinity mask, which taskset and container CPU sets
// narrow; else the hardware's count), read once.
inline int usable_cpus() {
  static const int count = [] {
#if defined(__linux__)
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) == 0 && CPU_COUNT(&set) > 0) return CPU_COUNT(&set);
#endif
    const unsigned hw = std::thread::hardware_concurrency();
    return hw > 0 ? static_cast<int>(hw) : 1;
  }();
  return count;
}

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

// Counts the fork() calls this process descends from. A child of fork() has only the thread that
// called it: the workers of every team it copied do not exist there, and a mutex of theirs may
// have been copied locked. A team that sees the count change leaves that state alone and starts
// afresh (ThreadTeam::state()).
inline std::atomic<unsigned>& fork_generation() {
  static std::atomic<unsigned> generation{0};
  return generation;
}

inline unsigned current_fork_generation() {
#if defined(__unix__) || defined(__APPLE__)
  static const bool watching = [] {
    return pthread_atfork(nullptr, nullptr, [] { fork_generation().fetch_add(1, std::memory_order_relaxed); }) == 0;
  }();
  (void)watching;
#endif
  return fork_generation().load(std::memory_order_relaxed);
}

}  // namespace detail

class ThreadTeam {
 public:
  // How long an idle worker stays awake for the next region. Regions of one pass follow each other
  // within microseconds; the gaps between passes (sampling, a scheduler's bookkeeping) are longer
  // and let the workers sleep.
  static constexpr std::chrono::microseconds kSpinWindow{250};

  // How a worker is started: std::thread by default; tests pass one that refuses.
  using Spawn = std::thread (*)(std::function<void()>);

  explicit ThreadTeam(Spawn spawn = [](std::function<void()> f) { return std::thread(std::move(f)); }) : spawn_(spawn) {}
  ThreadTeam(const ThreadTeam&) = delete;
  ThreadTeam& operator=(const ThreadTeam&) = delete;
  ~ThreadTeam() {
    if (!state_) return;
    if (state_->generation != detail::current_fork_generation()) {
      abandon();
      return;
    }
    {
      std::lock_guard<std::mutex> lock(state_->mutex);
      state_->stop.store(true, std::memory_order_relaxed);
      state_->ticket.fetch_add(kTicketStep, std::memory_order_release);
    }
    state_->wake.notify_all();
    for (auto& w : state_->workers) w.join();
  }

  // The team of the calling thread.
  static ThreadTeam& of_this_thread() {
    thread_local ThreadTeam team;
    return team;
  }

  // Runs body(i) for i in [0, threads): i = 0 on the calling thread, the others on workers.
  // Returns once every call has returned, rethrowing the first exception any of them threw.
  // Where the system refuses to start a worker (a thread limit, no memory for its stack), the
  // region runs with the workers it has, so `body` must not rely on every index being called:
  // parallel_for hands its items out dynamically.
  // Called inside a region (this team's or another's), it runs body(0) alone on the calling
  // thread: a nested region would rewrite the job the outer region's workers are running.
  template <class Body>
  void run(int threads, Body& body) {
    if (threads <= 1 || detail::region_place().inside) {
      body(0);
      return;
    }
    State& s = state();
    const int helpers = start_workers(s, threads - 1 < kMaxHelpers ? threads - 1 : kMaxHelpers);
    if (helpers == 0) {
      enter(0, [&] { body(0); });
      return;
    }
    s.job = [](void* b, int i) { (*static_cast<Body*>(b))(i); };
    s.body = &body;
    s.error = nullptr;
    s.pending.store(helpers, std::memory_order_relaxed);
    {
      // The ticket carries the helper count, so a worker learns from one load whether the region
      // is its own; the others never read job, which the next region may be rewriting.
      std::lock_guard<std::mutex> lock(s.mutex);
      const std::uint64_t next = (s.ticket.load(std::memory_order_relaxed) / kTicketStep + 1) * kTicketStep;
      s.ticket.store(next + static_cast<std::uint64_t>(helpers), std::memory_order_release);
      // With a CPU for every worker, sleepers wake for any region and spin through the next few
      // (see next_ticket); otherwise only a sleeping helper of this region needs the wake-up.
      const std::size_t last = s.spare_cpus.load(std::memory_order_relaxed) ? s.asleep.size() - 1
                                                                             : static_cast<std::size_t>(helpers);
      for (std::size_t i = 1; i <= last; ++i) {
        if (s.asleep[i] != 0) {
          s.wake.notify_all();
          break;
        }
      }
    }
    std::exception_ptr own;
    try {
      enter(0, [&] { body(0); });
    } catch (...) {
      own = std::current_exception();
    }
    // The workers hold references into the caller's frame until they are done, even when the
    // caller's own share threw.
    for (unsigned spins = 0; s.pending.load(std::memory_order_acquire) != 0; ++spins) {
      detail::cpu_relax();
      if ((spins & 63u) == 63u) std::this_thread::yield();
    }
    if (own) std::rethrow_exception(own);
    if (s.error) std::rethrow_exception(s.error);
  }

  // Workers running now (started on first use; fewer than asked where the system refused one).
  int workers() const { return state_ ? static_cast<int>(state_->workers.size()) : 0; }

 private:
  static constexpr std::uint64_t kTicketStep = 1u << 16;
  static constexpr int kMaxHelpers = static_cast<int>(kTicketStep) - 1;

  // What the workers share with the team, on the heap so that a forked child can leave its copy
  // (threads that do not exist, a mutex perhaps copied locked) untouched.
  struct State {
    unsigned generation = detail::current_fork_generation();
    std::vector<std::thread> workers;
    bool refused = false;  // the system refused a worker once: no more attempts
    std::mutex mutex;
    std::condition_variable wake;
    std::vector<unsigned char> asleep;      // by worker index (1..): waiting on `wake`; guarded by mutex
    // Every worker and the opening thread have a CPU of their own: idle workers may keep spinning
    // through regions they take no part in (nobody waits for the CPU they burn).
    std::atomic<bool> spare_cpus{true};
    std::atomic<std::uint64_t> ticket{0};   // region number x kTicketStep + its helper count
    std::atomic<int> pending{0};            // helpers of the current region not yet done
    std::atomic<bool> stop{false};
    void (*job)(void*, int) = nullptr;      // the current region, written before its ticket
    void* body = nullptr;
    std::exception_ptr error;               // the first exception a helper threw (guarded by mutex)
  };

  State& state() {
    if (state_ && state_->generation != detail::current_fork_generation()) abandon();
    if (!state_) state_.reset(new State);
    return *state_;
  }

  // Keeps a forked-away state reachable (a leak checker would report it otherwise) and never
  // touches it again: destroying it would join threads that do not exist in this process.
  void abandon() {
    static auto* kept = new std::vector<State*>;
    kept->push_back(state_.release());
  }

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

  // Starts workers up to `helpers` and returns how many there are for this region.
  int start_workers(State& s, int helpers) {
    // Reserved first: a std::thread dropped by a failed push_back would terminate the process.
    if (!s.refused && static_cast<int>(s.workers.size()) < helpers) {
      s.workers.reserve(static_cast<std::size_t>(helpers));
      std::lock_guard<std::mutex> lock(s.mutex);  // sleeping workers write their own entries
      if (s.asleep.size() < static_cast<std::size_t>(helpers) + 1) s.asleep.resize(static_cast<std::size_t>(helpers) + 1, 0);
    }
    while (!s.refused && static_cast<int>(s.workers.size()) < helpers) {
      const int index = static_cast<int>(s.workers.size()) + 1;
      const std::uint64_t seen = s.ticket.load(std::memory_order_relaxed);
      State* shared = &s;
      try {
        s.workers.push_back(spawn_([shared, index, seen] { work(*shared, index, seen); }));
      } catch (const std::system_error&) {
        s.refused = true;
      }
    }
    const int have = static_cast<int>(s.workers.size());
    s.spare_cpus.store(have + 1 <= detail::usable_cpus(), std::memory_order_relaxed);
    return have < helpers ? have : helpers;
  }

  static void work(State& s, int index, std::uint64_t seen) {
    for (;;) {
      seen = next_ticket(s, seen, index);
      if (s.stop.load(std::memory_order_relaxed)) return;
      try {
        enter(index, [&] { s.job(s.body, index); });
      } catch (...) {
        std::lock_guard<std::mutex> lock(s.mutex);
        if (!s.error) s.error = std::current_exception();
      }
      s.pending.fetch_sub(1, std::memory_order_acq_rel);
    }
  }

  // Waits for a region that needs worker `index`, or for the team to stop: spinning for
  // kSpinWindow, then asleep. No region can pass a worker it needs: the next ticket is issued only
  // after every helper of this one is done. A region that does not need this worker restarts its
  // spin window only when the team has a CPU per worker (the next wide region of the pass then
  // finds it awake, as before); on a machine with fewer CPUs than the team, idle workers spinning
  // through small regions took the CPUs those regions ran on (2,000 two-thread regions took 0.35 s
  // beside 63 idle workers on 2 CPUs, 0.05 s beside none), so there they sleep on.
  static std::uint64_t next_ticket(State& s, std::uint64_t seen, int index) {
    const auto needed = [&](std::uint64_t t) {
      return static_cast<int>(t % kTicketStep) >= index || s.stop.load(std::memory_order_relaxed);
    };
    for (;;) {
      bool restart = false;
      const auto start = std::chrono::steady_clock::now();
      for (unsigned spins = 1;; ++spins) {
        const std::uint64_t t = s.ticket.load(std::memory_order_acquire);
        if (t != seen) {
          if (needed(t)) return t;
          if (s.spare_cpus.load(std::memory_order_relaxed)) {
            seen = t;
            restart = true;
            break;
          }
        }
        detail::cpu_relax();
        if ((spins & 63u) == 0u) {
          if (std::chrono::steady_clock::now() - start > kSpinWindow) break;
          std::this_thread::yield();
        }
      }
      if (restart) continue;
      std::unique_lock<std::mutex> lock(s.mutex);
      s.asleep[static_cast<std::size_t>(index)] = 1;
      s.wake.wait(lock, [&] {
        const std::uint64_t t = s.ticket.load(std::memory_order_relaxed);
        return t != seen && (needed(t) || s.spare_cpus.load(std::memory_order_relaxed));
      });
      s.asleep[static_cast<std::size_t>(index)] = 0;
      const std::uint64_t t = s.ticket.load(std::memory_order_acquire);
      if (needed(t)) return t;
      seen = t;  // woken by a region without it (a CPU per worker): spin for the next one
    }
  }

  Spawn spawn_;
  std::unique_ptr<State> state_;
};

}  // namespace diffusion_gemma::cpu
