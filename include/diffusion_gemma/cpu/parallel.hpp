// SPDX-License-Identifier: Apache-2.0
// Thread control for the CPU back-end. Work is split into pieces whose boundaries never depend on
// the thread count, so results are bitwise identical with 1, 2 or 16 threads. The thread count is
// passed to each parallel region (OpenMP's num_threads clause); nothing here changes process-wide
// state.
#pragma once

#include <cstdint>

#if defined(_OPENMP)
#include <omp.h>
#endif

namespace diffusion_gemma::cpu {

// Threads a region gets for a requested count (0: the OpenMP default, OMP_NUM_THREADS or cores).
inline int resolve_threads(int requested) {
#if defined(_OPENMP)
  return requested > 0 ? requested : omp_get_max_threads();
#else
  (void)requested;
  return 1;
#endif
}

inline int max_threads() { return resolve_threads(0); }

inline int thread_index() {
#if defined(_OPENMP)
  return omp_get_thread_num();
#else
  return 0;
#endif
}

// Below this many elementary operations a row-wise region runs on the calling thread: waking and
// joining another thread costs a few microseconds, more than such a region's work (measured on the
// bundled model: a 16-row pass ran 1.4x slower on 2 threads than on 1 before this threshold).
inline constexpr double kMinParallelWork = 65536.0;

// Threads for a region of `work` elementary operations, given the requested count.
inline int threads_for_work(int threads, double work) { return work < kMinParallelWork ? 1 : threads; }

// Runs f(i) for i in [0, n) on up to `threads` threads (0: the default); each i is independent.
// Inside a parallel region it runs serially: the outer loop already owns the threads. Indices are
// handed out dynamically, one at a time when there are few (uneven tasks such as experts), in
// runs of n / (8 threads) when there are many (rows of a matrix), to keep the hand-out cheap.
template <class F>
void parallel_for(std::int64_t n, F&& f, int threads = 0) {
#if defined(_OPENMP)
  const int t = resolve_threads(threads);
  if (n <= 1 || t <= 1 || omp_in_parallel()) {
    for (std::int64_t i = 0; i < n; ++i) f(i);
    return;
  }
  const std::int64_t chunk = n >= 64 * t ? n / (8 * t) : 1;
#pragma omp parallel for schedule(dynamic, chunk) num_threads(t)
  for (std::int64_t i = 0; i < n; ++i) f(i);
#else
  (void)threads;
  for (std::int64_t i = 0; i < n; ++i) f(i);
#endif
}

}  // namespace diffusion_gemma::cpu
