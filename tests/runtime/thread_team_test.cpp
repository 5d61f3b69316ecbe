// SPDX-License-Identifier: Apache-2.0
// The CPU back-end's parallel regions (cpu/parallel.hpp on cpu/thread_team.hpp): every index once,
// thread indices below the region's count, nested regions serial, exceptions carried to the caller
// after every share is done, workers woken after they fell asleep, one team per calling thread, a
// region that still runs when the system refuses workers, and a forked child that starts its own.
// Tagged [concurrency], so the ThreadSanitizer build (scripts/sanitize.sh) runs it, except the fork
// test (ThreadSanitizer does not follow a multi-threaded process through fork).
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <functional>
#include <stdexcept>
#include <system_error>
#include <thread>
#include <vector>

#if defined(__unix__)
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>
#endif

#include <diffusion_gemma/cpu/parallel.hpp>

#include "support/catch.hpp"

using namespace diffusion_gemma;

namespace {

// Runs parallel_for(n) on `threads` threads and checks that each index ran exactly once, on a
// thread whose index is below the region's thread count.
void check_cover(std::int64_t n, int threads) {
  std::vector<std::atomic<int>> hits(static_cast<std::size_t>(n));
  std::atomic<int> bad_index{0};
  cpu::parallel_for(
      n,
      [&](std::int64_t i) {
        hits[static_cast<std::size_t>(i)].fetch_add(1, std::memory_order_relaxed);
        const int t = cpu::thread_index();
        if (t < 0 || t >= threads) bad_index.fetch_add(1, std::memory_order_relaxed);
      },
      threads);
  int wrong = 0;
  for (auto& h : hits) wrong += h.load() != 1 ? 1 : 0;
  INFO("n " << n << ", threads " << threads);
  CHECK(wrong == 0);
  CHECK(bad_index.load() == 0);
}

}  // namespace

TEST_CASE("parallel_for runs every index once on threads below the region's count", "[runtime][concurrency]") {
  for (int threads : {1, 2, 3, 4, 2})
    for (std::int64_t n : {0, 1, 2, 5, 63, 64 * 4, 1000, 4099}) check_cover(n, threads);
  CHECK(cpu::thread_index() == 0);  // outside a region
}

TEST_CASE("a region inside a region runs serially on the thread that opened it", "[runtime][concurrency]") {
  std::atomic<int> mismatched{0}, inner_calls{0};
  cpu::parallel_for(
      8,
      [&](std::int64_t) {
        const int outer = cpu::thread_index();
        cpu::parallel_for(
            16,
            [&](std::int64_t) {
              inner_calls.fetch_add(1, std::memory_order_relaxed);
              if (cpu::thread_index() != outer) mismatched.fetch_add(1, std::memory_order_relaxed);
            },
            4);
      },
      2);
  CHECK(inner_calls.load() == 8 * 16);
  CHECK(mismatched.load() == 0);
}

TEST_CASE("ThreadTeam::run called inside a region runs its body alone on the calling thread", "[runtime][concurrency]") {
  // Before, a run on the same team from the opening thread's share rewrote the outer region's job
  // and waited forever for workers that were still in the outer one.
  cpu::ThreadTeam& team = cpu::ThreadTeam::of_this_thread();
  std::atomic<int> outer_calls{0}, inner_calls{0}, inner_not_zero{0};
  std::function<void(int)> outer = [&](int i) {
    outer_calls.fetch_add(1, std::memory_order_relaxed);
    if (i != 0) return;
    std::function<void(int)> inner = [&](int j) {
      inner_calls.fetch_add(1, std::memory_order_relaxed);
      if (j != 0) inner_not_zero.fetch_add(1, std::memory_order_relaxed);
    };
    team.run(3, inner);
  };
  team.run(3, outer);
  CHECK(inner_calls.load() == 1);
  CHECK(inner_not_zero.load() == 0);
  CHECK(outer_calls.load() >= 1);
  check_cover(100, 3);  // the team still works
}

TEST_CASE("an exception thrown in a region reaches the caller once every share is done", "[runtime][concurrency]") {
  for (std::int64_t thrower : {0, 5, 31}) {
    std::atomic<int> finished{0};
    std::vector<int> data(32, 0);
    CHECK_THROWS_WITH(cpu::parallel_for(
                          32,
                          [&](std::int64_t i) {
                            if (i == thrower) throw std::runtime_error("task failed");
                            data[static_cast<std::size_t>(i)] = 1;  // the caller's frame, still alive
                            finished.fetch_add(1, std::memory_order_relaxed);
                          },
                          2),
                      "task failed");
    // Only the throwing task's own remaining indices (its chunk is one index here) are skipped.
    CHECK(finished.load() == 31);
  }
  // The team still works after a failed region.
  check_cover(100, 2);
}

TEST_CASE("workers that fell asleep between regions wake for the next one", "[runtime][concurrency]") {
  for (int round = 0; round < 3; ++round) {
    check_cover(50, 2);
    // Longer than the spin window: the workers go to sleep.
    std::this_thread::sleep_for(cpu::ThreadTeam::kSpinWindow * 8);
  }
  check_cover(50, 4);  // a region with more threads starts more workers
  check_cover(50, 2);  // and one with fewer leaves the extra ones out
}

TEST_CASE("threads that open regions at once each get their own team", "[runtime][concurrency]") {
  std::vector<std::thread> callers;
  std::atomic<int> failures{0};
  for (int c = 0; c < 3; ++c)
    callers.emplace_back([&] {
      for (int r = 0; r < 50; ++r) {
        std::atomic<std::int64_t> sum{0};
        cpu::parallel_for(
            257, [&](std::int64_t i) { sum.fetch_add(i, std::memory_order_relaxed); }, 2);
        if (sum.load() != 257 * 256 / 2) failures.fetch_add(1);
      }
    });
  for (auto& t : callers) t.join();
  CHECK(failures.load() == 0);
}

namespace {

// A spawner that starts one worker and then refuses, as the system does at a thread limit.
std::atomic<int> spawned{0};
std::thread spawn_one_then_refuse(std::function<void()> f) {
  if (spawned.fetch_add(1) >= 1) throw std::system_error(std::make_error_code(std::errc::resource_unavailable_try_again));
  return std::thread(std::move(f));
}
std::thread spawn_none(std::function<void()>) {
  throw std::system_error(std::make_error_code(std::errc::resource_unavailable_try_again));
}

// Runs a region of `threads` on `team` and returns how many indices ran (each must run once).
int run_region(cpu::ThreadTeam& team, int threads, std::int64_t n, std::vector<int>& seen_threads) {
  std::vector<std::atomic<int>> hits(static_cast<std::size_t>(n));
  std::vector<std::atomic<int>> by_thread(static_cast<std::size_t>(threads));
  std::atomic<std::int64_t> next{0};
  auto share = [&](int t) {
    for (std::int64_t i; (i = next.fetch_add(1)) < n;) {
      hits[static_cast<std::size_t>(i)].fetch_add(1);
      by_thread[static_cast<std::size_t>(t)].fetch_add(1);
      std::this_thread::sleep_for(std::chrono::microseconds(50));  // long enough for every worker to join in
    }
  };
  team.run(threads, share);
  int once = 0;
  for (auto& h : hits) once += h.load() == 1 ? 1 : 0;
  seen_threads.clear();
  for (int t = 0; t < threads; ++t)
    if (by_thread[static_cast<std::size_t>(t)].load() > 0) seen_threads.push_back(t);
  return once;
}

}  // namespace

TEST_CASE("a region runs with the workers it has when the system refuses to start more", "[runtime][concurrency]") {
  std::vector<int> ran_on;
  {
    spawned = 0;
    cpu::ThreadTeam team(spawn_one_then_refuse);
    CHECK(run_region(team, 4, 400, ran_on) == 400);
    CHECK(team.workers() == 1);
    CHECK(ran_on.back() <= 1);  // only the caller (0) and the one worker (1)
    CHECK(run_region(team, 4, 400, ran_on) == 400);
    CHECK(spawned.load() == 2);  // refused once, never asked again
  }
  {
    cpu::ThreadTeam team(spawn_none);
    CHECK(run_region(team, 3, 100, ran_on) == 100);
    CHECK(team.workers() == 0);
    REQUIRE(ran_on.size() == 1);
    CHECK(ran_on[0] == 0);
  }
}

#if defined(__unix__)
namespace {
// Set in the forked child. Its parent's workers do not exist there, so whatever their
// thread_local scratch holds is unreachable from any live thread: LeakSanitizer would report it
// at the child's exit, though nothing leaked in the process that allocated it.
volatile int in_forked_child = 0;
}  // namespace

// LeakSanitizer asks this (when the program provides it) before its check at exit.
extern "C" int __lsan_is_turned_off() { return in_forked_child; }

TEST_CASE("a child of fork() runs regions on workers of its own and exits", "[runtime][fork]") {
  check_cover(1000, 2);  // this thread's team has a worker now, which the child will not have
  const pid_t child = fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    in_forked_child = 1;
    std::atomic<std::int64_t> sum{0};
    cpu::parallel_for(
        1000, [&](std::int64_t i) { sum.fetch_add(i, std::memory_order_relaxed); }, 2);
    // std::exit runs this thread's thread_local destructors, the team's among them.
    std::exit(sum.load() == 1000 * 999 / 2 ? 0 : 1);
  }
  int status = 0;
  pid_t done = 0;
  for (int waited_ms = 0; waited_ms < 20000 && (done = waitpid(child, &status, WNOHANG)) == 0; waited_ms += 10)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  if (done == 0) {
    kill(child, SIGKILL);
    waitpid(child, &status, 0);
    FAIL("the forked child hung (20 s)");
  }
  REQUIRE(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 0);
  check_cover(1000, 2);  // the parent's team is untouched
}
#endif
