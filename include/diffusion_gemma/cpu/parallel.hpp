// SPDX-License-Identifier: Apache-2.0
// Thread control for the CPU back-end. Work is split into pieces whose boundaries never depend on
// the thread count, so results are bitwise identical with 1, 2 or 16 threads.
#pragma once

#include <cstdint>

#if defined(_OPENMP)
#include <omp.h>
#endif

namespace diffusion_gemma::cpu {

inline int max_threads() {
#if defined(_OPENMP)
  return omp_get_max_threads();
#else
  return 1;
#endif
}

inline void set_threads(int n) {
#if defined(_OPENMP)
  if (n > 0) omp_set_num_threads(n);
#else
  (void)n;
#endif
}

inline int thread_index() {
#if defined(_OPENMP)
  return omp_get_thread_num();
#else
  return 0;
#endif
}

// Runs f(i) for i in [0, n) across threads; each i is independent. Inside a parallel region it
// runs serially: the outer loop already owns the threads.
template <class F>
void parallel_for(std::int64_t n, F&& f) {
#if defined(_OPENMP)
  if (n <= 1 || omp_in_parallel()) {
    for (std::int64_t i = 0; i < n; ++i) f(i);
    return;
  }
#pragma omp parallel for schedule(dynamic, 1)
  for (std::int64_t i = 0; i < n; ++i) f(i);
#else
  for (std::int64_t i = 0; i < n; ++i) f(i);
#endif
}

}  // namespace diffusion_gemma::cpu
