// SPDX-License-Identifier: Apache-2.0
// Load test of `dgemma serve` on loopback (bounded: 128 requests, a deadline): 32 concurrent
// streaming clients x 4 requests each, some hanging up mid-stream and some sending malformed
// bodies. Every well-formed request's answer (text, finish_reason, usage) must equal the same
// request run alone beforehand; the server's RSS must stay within its idle RSS (weights included)
// plus --memory-budget plus a fixed allowance for HTTP threads; the batcher's own accounting must
// stay within the budget. Prints p50/p99 latency and throughput.
//   dg_serve_load DGEMMA MODEL_DIR [clients=32] [per_client=4]
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

#include "serve_harness.hpp"

using namespace serve_test;
using Clock = std::chrono::steady_clock;

namespace {

// Built with AddressSanitizer (scripts/sanitize.sh builds dgemma the same way), RSS holds shadow
// memory and the allocation quarantine: the RSS bound is then reported, not checked.
#if defined(__SANITIZE_ADDRESS__)
constexpr bool kAsan = true;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
constexpr bool kAsan = true;
#else
constexpr bool kAsan = false;
#endif
#else
constexpr bool kAsan = false;
#endif

constexpr int kBudgetMib = 64;  // about 4 requests of the bundled model at once (each ~14 MiB), fewer than --max-batch
constexpr long kAllowanceKib = 48 * 1024;  // HTTP thread stacks, allocator arenas, buffers
const std::string kModelId = "dg-tiny-tasks";

enum class Kind { kWellFormed, kMalformed, kHangUp };

struct Job {
  Kind kind = Kind::kWellFormed;
  std::string path = "/v1/chat/completions";
  std::string body;
  // results
  Reply alone, loaded;
  double seconds = 0;
};

std::string prompt_for(int i) {
  static const char* kPrompts[] = {"Add: 417 + 385", "Sort ascending: 93 44 60 89 20", "Reverse: cat, moon, ship, blue",
                                   "Add: 120 + 999", "Sort ascending: 5 81 17 42", "Reverse: red, one, sky",
                                   "Add: 5 + 7", "Sort ascending: 64 2 33 90 11 8"};
  return kPrompts[i % 8];
}

Job make_job(int i) {
  Job j;
  if (i % 16 == 5) {
    j.kind = Kind::kMalformed;
    const char* bad[] = {R"({"model":")", R"({"model":"dg-tiny-tasks","messages":[{"role":"user","content":"x"}],"max_tokens":"many"})",
                         R"({"model":"dg-tiny-tasks","messages":[{"role":"tool","content":"x"}]})"};
    j.body = bad[(i / 16) % 3];
    return j;
  }
  if (i % 16 == 9) {
    // A raw prompt on which the bundled model (seed 0) writes every token without a stop id: long
    // enough that the server must notice the hang-up before the stream would end.
    j.kind = Kind::kHangUp;
    j.path = "/v1/completions";
    j.body = R"({"model":")" + kModelId +
             R"(","prompt":"Sort ascending: 93 44 60 89 20","max_tokens":200,"stream":true,"seed":0,)" +
             R"("dgemma":{"stability_threshold":100000}})";
    return j;
  }
  const int max_tokens[] = {16, 32, 48};
  std::string extra;
  if (i % 7 == 3) extra += R"(,"stop":[", ","9"])";
  if (i % 11 == 2) extra += R"(,"dgemma":{"stream_drafts":true,"max_denoising_steps":12})";
  if (i % 5 == 4) extra += R"(,"dgemma":{"t_min":0.3,"t_max":0.9})";
  j.body = R"({"model":")" + kModelId + R"(","messages":[{"role":"user","content":")" + prompt_for(i) +
           R"("}],"stream":true,"seed":)" + std::to_string(1000 + i) + R"(,"max_tokens":)" +
           std::to_string(max_tokens[i % 3]) + extra + "}";
  return j;
}

double percentile(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const std::size_t i = std::min(v.size() - 1, static_cast<std::size_t>(q * static_cast<double>(v.size() - 1) + 0.5));
  return v[i];
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: dg_serve_load DGEMMA MODEL_DIR [clients] [per_client]\n");
    return 2;
  }
  const int clients = argc > 3 ? std::atoi(argv[3]) : 32;
  const int per_client = argc > 4 ? std::atoi(argv[4]) : 4;
  const auto started = Clock::now();
  try {
    ServerProcess s(argv[1], {"--model", argv[2], "--threads", "1", "--max-batch", "8", "--max-queue", "256",
                              "--memory-budget", std::to_string(kBudgetMib), "--http-threads", "80"});
    const int port = s.port();
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    const long idle_kib = s.rss_kib();

    std::vector<Job> jobs;
    for (int i = 0; i < clients * per_client; ++i) jobs.push_back(make_job(i));

    // 1. Each well-formed request alone, one after another.
    for (auto& j : jobs) {
      if (j.kind != Kind::kWellFormed) continue;
      j.alone = post(port, j.path, j.body);
      CHECK(j.alone.status == 200 && j.alone.done, "alone: " + j.alone.body.substr(0, 300));
    }
    const long after_alone_kib = s.rss_kib();

    const double tokens_before = metric(get(port, "/metrics").body, "dgemma_generated_tokens_total");

    // 2. All clients at once; RSS and the batcher's memory sampled meanwhile.
    std::atomic<bool> running{true};
    long peak_kib = 0;
    double peak_in_use = 0, peak_batch = 0;
    std::thread sampler([&] {
      int tick = 0;
      while (running) {
        peak_kib = std::max(peak_kib, s.rss_kib());
        if (++tick % 5 == 0) {
          const std::string m = get(port, "/metrics").body;
          peak_in_use = std::max(peak_in_use, metric(m, "dgemma_memory_in_use_bytes"));
          peak_batch = std::max(peak_batch, metric(m, "dgemma_batch_size"));
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
      }
    });
    const auto t0 = Clock::now();
    std::vector<std::thread> threads;
    for (int c = 0; c < clients; ++c) {
      threads.emplace_back([&, c] {
        for (int k = 0; k < per_client; ++k) {
          Job& j = jobs[static_cast<std::size_t>(c * per_client + k)];
          const auto a = Clock::now();
          j.loaded = post(port, j.path, j.body, "", j.kind == Kind::kHangUp ? 300 : 0);
          j.seconds = std::chrono::duration<double>(Clock::now() - a).count();
        }
      });
    }
    for (auto& t : threads) t.join();
    const double wall = std::chrono::duration<double>(Clock::now() - t0).count();
    running = false;
    sampler.join();

    // 3. Answers, errors, hang-ups.
    std::vector<double> latencies;
    long tokens = 0;
    int same = 0, malformed = 0, hung_up = 0;
    for (std::size_t i = 0; i < jobs.size(); ++i) {
      const Job& j = jobs[i];
      if (j.kind == Kind::kMalformed) {
        CHECK(j.loaded.status == 400 && json::parse(j.loaded.body).contains("error"), "malformed: " + j.loaded.body);
        malformed += j.loaded.status == 400;
        continue;
      }
      if (j.kind == Kind::kHangUp) {
        ++hung_up;
        CHECK(!j.loaded.done, "request " + std::to_string(i) + " should have been hung up on: " + j.loaded.body.substr(0, 400));
        continue;
      }
      const bool equal = j.loaded.status == 200 && j.loaded.done && stream_text(j.loaded) == stream_text(j.alone) &&
                         stream_finish(j.loaded) == stream_finish(j.alone) &&
                         stream_usage(j.loaded) == stream_usage(j.alone);
      CHECK(equal, "request " + std::to_string(i) + " differs under load:\n  alone:  " + stream_text(j.alone) + " (" +
                       stream_finish(j.alone) + ")\n  loaded: " + stream_text(j.loaded) + " (" + stream_finish(j.loaded) +
                       ", status " + std::to_string(j.loaded.status) + " " + j.loaded.error + ")");
      same += equal;
      latencies.push_back(j.seconds);
      if (!stream_usage(j.loaded).is_null()) tokens += stream_usage(j.loaded)["completion_tokens"].get<long>();
    }
    // Hung-up requests were cancelled and nothing is left running.
    bool drained = false;
    std::string m;
    for (int i = 0; i < 200 && !drained; ++i) {
      m = get(port, "/metrics").body;
      drained = metric(m, "dgemma_active_requests") == 0 && metric(m, "dgemma_queue_depth") == 0 &&
                metric(m, "dgemma_memory_in_use_bytes") == 0;
      if (!drained) std::this_thread::sleep_for(std::chrono::milliseconds(25));
    }
    CHECK(drained, "requests left after the load:\n" + m);
    CHECK(metric(m, "dgemma_batch_size") == 0, "an idle server's batch size:\n" + m);
    CHECK(metric(m, "dgemma_client_disconnects_total") >= hung_up, "disconnects: " + m);
    // The hung-up requests were cancelled rather than run to their 200 tokens each: what the server
    // generated beyond the answers is well under that (a stop sequence's request may also run a
    // canvas past its match before its cancel takes effect).
    const double extra = metric(m, "dgemma_generated_tokens_total") - tokens_before - static_cast<double>(tokens);
    CHECK(extra < hung_up * 200 / 2, "tokens generated beyond the answers: " + std::to_string(extra) + " (" +
                                          std::to_string(hung_up) + " hang-ups of 200 tokens)");
    const long budget_kib = kBudgetMib * 1024L;
    CHECK(peak_in_use <= kBudgetMib * 1048576.0, "batcher memory " + std::to_string(peak_in_use) + " over the budget");
    if (kAsan) std::printf("AddressSanitizer build: the RSS bound is not checked\n");
    CHECK(kAsan || peak_kib <= idle_kib + budget_kib + kAllowanceKib,
          "peak RSS " + std::to_string(peak_kib) + " KiB > idle " + std::to_string(idle_kib) + " + budget " +
              std::to_string(budget_kib) + " + allowance " + std::to_string(kAllowanceKib));
    const int rc = s.terminate(30);
    CHECK(rc == 0, "exit code " + std::to_string(rc));

    std::printf("load: %d clients x %d requests: %d answers equal to the same request alone, %d malformed -> 400, "
                "%d hung up mid-stream\n",
                clients, per_client, same, malformed, hung_up);
    std::printf("latency (well-formed streams, send to [DONE]): p50 %.3f s, p99 %.3f s, max %.3f s\n",
                percentile(latencies, 0.5), percentile(latencies, 0.99), percentile(latencies, 1.0));
    std::printf("throughput: %.1f requests/s, %.1f completion tokens/s over %.2f s; largest batch %.0f\n",
                static_cast<double>(jobs.size()) / wall, static_cast<double>(tokens) / wall, wall, peak_batch);
    std::printf("hang-ups: %.0f tokens generated beyond the answers (uncancelled they would be %d)\n", extra,
                hung_up * 200);
    std::printf("memory: RSS idle %.1f MiB (weights included), after the alone runs %.1f MiB, peak under load %.1f MiB; "
                "budget %d MiB; batcher's peak in use %.2f MiB\n",
                idle_kib / 1024.0, after_alone_kib / 1024.0, peak_kib / 1024.0, kBudgetMib, peak_in_use / 1048576.0);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "FAILED: %s\n", e.what());
    return 1;
  }
  const double total = std::chrono::duration<double>(Clock::now() - started).count();
  std::printf("total %.1f s\n", total);
  if (failures) {
    std::fprintf(stderr, "%d checks failed\n", failures);
    return 1;
  }
  std::printf("dgemma serve load test: all checks passed\n");
  return 0;
}
