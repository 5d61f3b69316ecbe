// SPDX-License-Identifier: Apache-2.0
// Thread control for the CPU back-end. Work is split into pieces whose boundaries never depend on
// the thread count, so results are bitwise identical with 1, 2 or 16 threads. The thread count is
// passed to each parallel region, which runs on the calling thread's team (thread_team.hpp);
// nothing here changes process-wide state.
#pragma once

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <thread>

#include <diffusion_gemma/cpu/thread_team.hpp>

namespace diffusion_gemma::cpu {

// The most threads one engine runs (EngineOptions::threads, --threads, OMP_NUM_THREADS): each is a
// worker kept for the life of its team, and per-thread scratch is sized by it.
inline constexpr int kMaxThreads = 1024;

// The thread count of `threads = 0`: OMP_NUM_THREADS when it is set to a positive number (the
// variable users already set to cap a machine's CPU libraries; its first entry when it is a list;
// at most kMaxThreads), otherwise the CPUs this process may run on (its affinity mask, which
// taskset and container CPU sets narrow), read once. A value that is not a number ("abc", "3x")
// is ignored, as OpenMP runtimes ignore it.
inline int default_threads() {
  static const int count = [] {
    if (const char* env = std::getenv("OMP_NUM_THREADS")) {
      char* end = nullptr;
      const long n = std::strtol(env, &end, 10);
      if (end != env && (*end == '\0' || *end == ',') && n > 0) return static_cast<int>(n < kMaxThreads ? n : kMaxThreads);
    }
    return detail::usable_cpus();
  }();
  return count;
}

// Threads a region gets for a requested count (0: default_threads()).
inline int resolve_threads(int requested) { return requested > 0 ? requested : default_threads(); }

inline int max_threads() { return resolve_threads(0); }

// This thread's index in the region it runs, below the region's thread count (0 outside a region).
inline int thread_index() { return detail::region_place().index; }

// Below this many elementary operations a row-wise region runs on the calling thread: handing a
// share to another thread and joining it costs a few microseconds, more than such a region's work
// (measured on the bundled model: a 16-row pass ran 1.4x slower on 2 threads than on 1 before this
// threshold).
inline constexpr double kMinParallelWork = 65536.0;

// Threads for a region of `work` elementary operations, given the requested count.
inline int threads_for_work(int threads, double work) { return work < kMinParallelWork ? 1 : threads; }

// Runs f(i) for i in [0, n) on up to `threads` threads (0: the default); each i is independent.
// Inside a parallel region it runs serially: the outer loop already owns the threads. Indices are
// handed out dynamically, one at a time when there are few (uneven tasks such as experts), in
// runs of n / (8 threads) when there are many (rows of a matrix), to keep the hand-out cheap.
template <class F>
void parallel_for(std::int64_t n, F&& f, int threads = 0) {
  const std::int64_t wanted = resolve_threads(threads);
  const int t = static_cast<int>(wanted < n ? wanted : n);
  if (t <= 1 || detail::region_place().inside) {
    for (std::int64_t i = 0; i < n; ++i) f(i);
    return;
  }
  const std::int64_t chunk = n >= 64 * static_cast<std::int64_t>(t) ? n / (8 * static_cast<std::int64_t>(t)) : 1;
  std::atomic<std::int64_t> next{0};
  auto share = [&](int) {
    for (;;) {
      const std::int64_t i0 = next.fetch_add(chunk, std::memory_order_relaxed);
      if (i0 >= n) return;
      const std::int64_t i1 = n - i0 < chunk ? n : i0 + chunk;
      for (std::int64_t i = i0; i < i1; ++i) f(i);
    }
  };
  ThreadTeam::of_this_thread().run(t, share);
}

}  // namespace diffusion_gemma::cpu
