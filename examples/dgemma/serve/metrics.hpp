// SPDX-License-Identifier: Apache-2.0
// The counters and histograms behind GET /metrics, in Prometheus' text format (version 0.0.4).
// Handlers and the worker update them from any thread; one mutex is enough at this request rate.
#pragma once

#include <cstdint>
#include <cstdio>
#include <map>
#include <mutex>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

namespace dgemma::serve {

class Histogram {
 public:
  explicit Histogram(std::vector<double> bounds) : bounds_(std::move(bounds)), counts_(bounds_.size() + 1, 0) {}
  void observe(double v) {
    std::size_t i = 0;
    while (i < bounds_.size() && v > bounds_[i]) ++i;
    ++counts_[i];
    sum_ += v;
    ++count_;
  }
  void write(std::ostringstream& out, const std::string& name, const std::string& help) const {
    out << "# HELP " << name << " " << help << "\n# TYPE " << name << " histogram\n";
    std::uint64_t cumulative = 0;
    for (std::size_t i = 0; i < bounds_.size(); ++i) {
      cumulative += counts_[i];
      out << name << "_bucket{le=\"" << number(bounds_[i]) << "\"} " << cumulative << "\n";
    }
    out << name << "_bucket{le=\"+Inf\"} " << count_ << "\n";
    // The sum with every digit a double holds: rounded to 6 digits, a sum past 1e6 would stop
    // growing by single observations and rate(_sum) / rate(_count) would go wrong.
    char sum[40];
    std::snprintf(sum, sizeof sum, "%.17g", sum_);
    out << name << "_sum " << sum << "\n" << name << "_count " << count_ << "\n";
  }
  static std::string number(double v) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.6g", v);
    return buf;
  }

 private:
  std::vector<double> bounds_;
  std::vector<std::uint64_t> counts_;
  double sum_ = 0.0;
  std::uint64_t count_ = 0;
};

// What the worker's batcher reports at scrape time.
struct EngineGauges {
  std::size_t queued = 0, active = 0, bytes_in_use = 0, memory_budget = 0;
  int last_batch = 0;
  std::uint64_t passes = 0, denoise_rows = 0;
};

class Metrics {
 public:
  void request(const std::string& endpoint, int status) {
    std::lock_guard<std::mutex> lock(mu_);
    ++requests_[{endpoint, status}];
  }
  void latency(const std::string& endpoint, double seconds) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = latency_.find(endpoint);
    if (it == latency_.end()) it = latency_.emplace(endpoint, Histogram(kSeconds)).first;
    it->second.observe(seconds);
  }
  void first_chunk(double seconds) {
    std::lock_guard<std::mutex> lock(mu_);
    first_chunk_.observe(seconds);
  }
  // A finished generation: its tokens, the steps of each canvas, tokens per forward.
  void generation(std::int64_t tokens, const std::vector<int>& steps_per_canvas, double tokens_per_forward) {
    std::lock_guard<std::mutex> lock(mu_);
    generated_tokens_ += static_cast<std::uint64_t>(tokens);
    for (int s : steps_per_canvas) steps_.observe(s);
    tokens_per_forward_.observe(tokens_per_forward);
  }
  void disconnect() {
    std::lock_guard<std::mutex> lock(mu_);
    ++disconnects_;
  }
  void worker_error() {
    std::lock_guard<std::mutex> lock(mu_);
    ++worker_errors_;
  }

  std::string render(const EngineGauges& g) const {
    std::lock_guard<std::mutex> lock(mu_);
    std::ostringstream out;
    out << "# HELP dgemma_requests_total HTTP requests by endpoint and status code.\n"
           "# TYPE dgemma_requests_total counter\n";
    for (const auto& [key, n] : requests_) {
      out << "dgemma_requests_total{endpoint=\"" << key.first << "\",status=\"" << key.second << "\"} " << n << "\n";
    }
    gauge(out, "dgemma_queue_depth", "Accepted sequences (one per prompt and choice) waiting for a batch slot.", g.queued);
    gauge(out, "dgemma_active_requests", "Sequences in the running batch.", g.active);
    gauge(out, "dgemma_batch_size", "Sequences denoised together in the last pass; 0 while none runs.", g.last_batch);
    gauge(out, "dgemma_memory_in_use_bytes", "KV caches and workspace held by requests (beyond the weights).",
          g.bytes_in_use);
    gauge(out, "dgemma_memory_budget_bytes", "The --memory-budget (0: no limit).", g.memory_budget);
    counter(out, "dgemma_passes_total", "Batched model passes run by the worker.", g.passes);
    counter(out, "dgemma_denoise_rows_total", "Canvas rows denoised, summed over passes.", g.denoise_rows);
    counter(out, "dgemma_generated_tokens_total", "Tokens committed for finished requests (up to a stop id).",
            generated_tokens_);
    counter(out, "dgemma_client_disconnects_total", "Streams whose client went away; their requests were cancelled.",
            disconnects_);
    counter(out, "dgemma_worker_errors_total", "Exceptions thrown by a batcher step.", worker_errors_);
    steps_.write(out, "dgemma_denoising_steps_per_canvas", "Denoising steps each committed canvas took.");
    tokens_per_forward_.write(out, "dgemma_tokens_per_forward", "Generated tokens per denoiser pass, per request.");
    out << "# HELP dgemma_request_duration_seconds Time from a request's arrival to its last byte, by endpoint.\n"
           "# TYPE dgemma_request_duration_seconds histogram\n";
    for (const auto& [endpoint, h] : latency_) {
      std::ostringstream one;
      h.write(one, "dgemma_request_duration_seconds", "");
      out << relabel(one.str(), endpoint);
    }
    first_chunk_.write(out, "dgemma_time_to_first_chunk_seconds",
                       "Time from a request's arrival to its first committed canvas (a stream's first text chunk).");
    return out.str();
  }

 private:
  static inline const std::vector<double> kSeconds = {0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120};

  template <class T>
  static void gauge(std::ostringstream& out, const char* name, const char* help, T v) {
    out << "# HELP " << name << " " << help << "\n# TYPE " << name << " gauge\n" << name << " " << v << "\n";
  }
  template <class T>
  static void counter(std::ostringstream& out, const char* name, const char* help, T v) {
    out << "# HELP " << name << " " << help << "\n# TYPE " << name << " counter\n" << name << " " << v << "\n";
  }
  // The sample lines of one endpoint's histogram with an endpoint label (HELP/TYPE written once).
  static std::string relabel(const std::string& text, const std::string& endpoint) {
    std::istringstream in(text);
    std::string line, out;
    while (std::getline(in, line)) {
      if (line.empty() || line[0] == '#') continue;
      const std::string label = "endpoint=\"" + endpoint + "\"";
      const auto brace = line.find('{');
      if (brace != std::string::npos) {
        line.insert(brace + 1, label + ",");
      } else {
        const auto space = line.find(' ');
        line.insert(space, "{" + label + "}");
      }
      out += line + "\n";
    }
    return out;
  }

  mutable std::mutex mu_;
  std::map<std::pair<std::string, int>, std::uint64_t> requests_;
  std::map<std::string, Histogram> latency_;
  Histogram first_chunk_{kSeconds};
  Histogram steps_{{1, 2, 4, 8, 16, 32, 48, 64, 128, 256}};
  Histogram tokens_per_forward_{{0.25, 0.5, 1, 2, 4, 8, 16, 32}};
  std::uint64_t generated_tokens_ = 0, disconnects_ = 0, worker_errors_ = 0;
};

}  // namespace dgemma::serve
