// SPDX-License-Identifier: Apache-2.0
// How a long command turns SIGINT and SIGTERM into a cancellation: the signal sets a flag that the
// decoder's callbacks poll, so the command stops at a step boundary, keeps what it has and exits 130.
#pragma once

#include <atomic>
#include <csignal>

#include <signal.h>

namespace dgemma {

inline std::atomic<bool> g_interrupted{false};

extern "C" inline void dgemma_on_interrupt(int) { g_interrupted.store(true); }

// SIGINT and SIGTERM set g_interrupted while armed, except a signal the program started with
// ignored (a background job of a script), which stays ignored; the previous dispositions come back
// at disarm() or at the end of the scope, so that a second signal ends the program.
class InterruptGuard {
 public:
  InterruptGuard() {
    g_interrupted = false;
    // The dispositions are read without changing them, so that no signal is lost in between.
    struct sigaction old_int {}, old_term {};
    ::sigaction(SIGINT, nullptr, &old_int);
    ::sigaction(SIGTERM, nullptr, &old_term);
    previous_int_ = old_int.sa_handler;
    previous_term_ = old_term.sa_handler;
    if (previous_int_ != SIG_IGN) std::signal(SIGINT, dgemma_on_interrupt);
    if (previous_term_ != SIG_IGN) std::signal(SIGTERM, dgemma_on_interrupt);
  }
  InterruptGuard(const InterruptGuard&) = delete;
  InterruptGuard& operator=(const InterruptGuard&) = delete;
  ~InterruptGuard() { disarm(); }

  static bool interrupted() { return g_interrupted.load(); }

  void disarm() {
    if (!armed_) return;
    armed_ = false;
    std::signal(SIGINT, previous_int_ == SIG_ERR ? SIG_DFL : previous_int_);
    std::signal(SIGTERM, previous_term_ == SIG_ERR ? SIG_DFL : previous_term_);
  }

 private:
  void (*previous_int_)(int) = SIG_DFL;
  void (*previous_term_)(int) = SIG_DFL;
  bool armed_ = true;
};

}  // namespace dgemma
