// SPDX-License-Identifier: Apache-2.0
// Throughput of many requests at once: the same N requests (different prompts, lengths and seeds)
// served one at a time by a Decoder, then through a ContinuousBatcher at each --max-batch. Every
// batched answer is compared with the one-at-a-time answer (they must be identical). Prints JSON:
// the CPU, the kernel path, and per batch size the wall time, tokens per second and the speed-up.
// It also counts the model arithmetic of every pass (model_flops.hpp) and measures this CPU's peak
// for the kernels that ran (peak.hpp): the work divided by the peak is a floor on any schedule's
// time, so one-at-a-time seconds over that floor bound what batching can gain on this machine.
//
//   bench_batch --model DIR [--requests 16] [--max-batch 1,2,4,8,16] [--threads 0] [--precision fast]
//               [--prompt-tokens 24] [--steps 0 (the checkpoint's)] [--canvases 0 (its max_new_tokens)]
//               [--fixed-steps]   (no early stop: every request does the same work)
//               [--batched-only]  (skip the one-at-a-time run, for a profiler)
//
// Benchmarks measure; nothing gates on time.
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include <diffusion_gemma/cpu/engine.hpp>
#include <diffusion_gemma/runtime/batcher.hpp>
#include <diffusion_gemma/runtime/decoder.hpp>

#include "../cpu/model_flops.hpp"
#include "../cpu/peak.hpp"

namespace dg = diffusion_gemma;
using CpuEngine = dg::cpu::Engine<dg::DiffusionGemmaBackbone>;

// The CPU engine, tallying the model arithmetic of each pass it runs (the same passes whether a
// sequence runs alone or in a batch, since the answers are identical).
class Engine : public CpuEngine {
 public:
  using CpuEngine::CpuEngine;

  void encode(const std::int32_t* ids, std::int64_t n, Cache& cache) {
    flops_ += dg_bench::pass_flops(config(), n, cache.length(), false, false);
    CpuEngine::encode(ids, n, cache);
  }
  void denoise_step(const std::int32_t* canvas, std::int64_t n, bool first_step, const Cache& cache,
                    const dg::VocabPassArgs& args, dg::VocabPassResult& stats) {
    flops_ += step_flops(n, first_step, cache);
    CpuEngine::denoise_step(canvas, n, first_step, cache, args, stats);
  }
  void encode_batch(const dg::EncodeItem<Cache>* items, std::size_t count) {
    for (std::size_t i = 0; i < count; ++i)
      flops_ += dg_bench::pass_flops(config(), items[i].n, items[i].cache->length(), false, false);
    CpuEngine::encode_batch(items, count);
  }
  void denoise_step_batch(dg::DenoiseItem<Cache, DenoiseState>* items, std::size_t count) {
    for (std::size_t i = 0; i < count; ++i) flops_ += step_flops(items[i].n, items[i].first_step, *items[i].cache);
    CpuEngine::denoise_step_batch(items, count);
  }
  double flops() const { return flops_; }

 private:
  double step_flops(std::int64_t n, bool first_step, const Cache& cache) const {
    return dg_bench::pass_flops(config(), n, cache.length(), true, !first_step) + dg_bench::vocab_pass_flops(config(), n);
  }
  double flops_ = 0.0;
};
using Options = dg::DecodeOptions<dg::ReferenceSampler, dg::CanvasScheduler<>>;

namespace {

double now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

std::string arg(int argc, char** argv, const std::string& name, const std::string& fallback) {
  for (int i = 1; i + 1 < argc; ++i) {
    if (name == argv[i]) return argv[i + 1];
  }
  return fallback;
}

bool flag(int argc, char** argv, const std::string& name) {
  for (int i = 1; i < argc; ++i) {
    if (name == argv[i]) return true;
  }
  return false;
}

std::vector<int> int_list(const std::string& s) {
  std::vector<int> out;
  std::stringstream ss(s);
  for (std::string item; std::getline(ss, item, ',');) out.push_back(std::stoi(item));
  return out;
}

struct Request {
  std::vector<std::int32_t> prompt;
  Options options;
};

std::vector<std::int32_t> answer(const dg::GenerationResult& r) {
  std::vector<std::int32_t> a = r.tokens;
  for (const auto& c : r.canvases) a.push_back(c.steps);
  return a;
}

std::int64_t valid_tokens(const dg::GenerationResult& r, int pad) {
  std::int64_t n = 0;
  for (auto t : r.tokens) n += pad == dg::kNoPadToken || t != pad;
  return n;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const std::string dir = arg(argc, argv, "--model", "");
    if (dir.empty()) {
      std::cerr << "usage: bench_batch --model DIR [--requests 16] [--max-batch 1,2,4,8,16] [--threads 0] "
                   "[--precision fast|exact] [--prompt-tokens 24] [--steps N] [--canvases N] [--fixed-steps]\n";
      return 2;
    }
    const int n_requests = std::stoi(arg(argc, argv, "--requests", "16"));
    const auto batches = int_list(arg(argc, argv, "--max-batch", "1,2,4,8,16"));
    const int threads = std::stoi(arg(argc, argv, "--threads", "0"));
    const std::string precision = arg(argc, argv, "--precision", "fast");
    const int prompt_tokens = std::stoi(arg(argc, argv, "--prompt-tokens", "24"));
    const int steps = std::stoi(arg(argc, argv, "--steps", "0"));
    const int canvases = std::stoi(arg(argc, argv, "--canvases", "0"));
    const bool fixed = flag(argc, argv, "--fixed-steps");
    const bool profile = flag(argc, argv, "--batched-only");  // for a profiler: skips the one-at-a-time run

    auto model = dg::cpu::Model::load(dir);
    const auto& cfg = model->config();
    dg::cpu::EngineOptions eo;
    eo.threads = threads;
    eo.precision = precision == "exact" ? dg::cpu::Precision::kExact : dg::cpu::Precision::kFast;
    Engine engine(model, eo);

    std::vector<Request> requests;
    const std::int64_t V = cfg.vocab_size;
    for (int i = 0; i < n_requests; ++i) {
      Request r;
      r.options = dg::Decoder<Engine>::default_options(model->generation_config());
      r.options.sampler.rng.seed = 1000 + static_cast<std::uint64_t>(i);
      if (steps > 0) r.options.sampler.max_denoising_steps = steps;
      if (canvases > 0) r.options.scheduler.max_new_tokens = canvases * cfg.canvas_length;
      if (fixed) {
        r.options.scheduler.stop_token_ids = {static_cast<int>(V) + 1};
        r.options.sampler.stopping.stability_threshold = 1 << 20;
      }
      const int P = prompt_tokens / 2 + (i * 7) % (prompt_tokens + 1);  // ragged: P/2 .. 3P/2
      r.prompt.push_back(cfg.bos_token_id);
      for (int t = 1; t < P; ++t) r.prompt.push_back(static_cast<std::int32_t>((i * 7919 + t * 104729 + 17) % (V - 3) + 3));
      requests.push_back(std::move(r));
    }

    nlohmann::ordered_json out;
    out["model"] = dir;
    out["cpu"] = dg::cpu::cpu_features().brand;
    out["cpu_flags"] = dg::cpu::cpu_features().flags();
    out["kernels"] = engine.kernels().path();
    out["threads"] = dg::cpu::resolve_threads(threads);
    out["requests"] = n_requests;
    out["vocab_size"] = V;
    out["canvas_length"] = cfg.canvas_length;
    out["fixed_steps"] = fixed;

    // One at a time.
    std::vector<std::vector<std::int32_t>> reference;
    std::int64_t tokens = 0, forwards = 0;
    double flops = 0.0;
    double t0 = now();
    if (!profile) {
      dg::Decoder<Engine> decoder(model, eo);
      for (const auto& r : requests) {
        const auto g = decoder.generate(r.prompt, r.options);
        reference.push_back(answer(g));
        tokens += valid_tokens(g, r.options.scheduler.pad_token_id);
        forwards += g.forwards;
      }
      flops = decoder.engine().flops();
    }
    const double sequential = now() - t0;
    out["sequential_seconds"] = sequential;
    out["tokens"] = tokens;
    out["denoiser_forwards"] = forwards;
    out["sequential_tokens_per_second"] = static_cast<double>(tokens) / sequential;
    if (!profile) {
      // The arithmetic bound: no schedule does this work faster than the peak allows.
      const dg::cpu::KernelContext& kc = engine.kernels();
      const double peak = dg_bench::measured_peak_gflops(kc.isa, kc.bf16_tiles() || kc.bf16_dots(), kc.threads);
      out["model_flops"] = flops;
      out["peak_gflops"] = peak;
      out["peak_kind"] = kc.bf16_tiles() ? "AMX-BF16 tile products" : kc.bf16_dots() ? "AVX512-BF16 dot products" : "fp32 FMA";
      out["sequential_gflops"] = flops / sequential / 1e9;
      if (peak > 0.0) {
        out["sequential_fraction_of_peak"] = flops / sequential / 1e9 / peak;
        out["speedup_ceiling_at_peak"] = sequential / (flops / (peak * 1e9));
      }
    }

    nlohmann::ordered_json rows = nlohmann::json::array();
    for (int mb : batches) {
      dg::ContinuousBatcher<Engine>::Limits limits;
      limits.max_batch = mb;
      limits.max_queue = static_cast<std::size_t>(n_requests) + 1;
      dg::ContinuousBatcher<Engine> batcher(engine, limits);
      std::vector<std::vector<std::int32_t>> got(requests.size());
      const double flops_before = engine.flops();
      t0 = now();
      for (std::size_t i = 0; i < requests.size(); ++i) {
        dg::ContinuousBatcher<Engine>::Request r;
        r.prompt = requests[i].prompt;
        r.options = requests[i].options;
        r.on_done = [&got, i](const dg::GenerationResult& g, const dg::Status&) { got[i] = answer(g); };
        batcher.submit(std::move(r));
      }
      while (batcher.step()) {
      }
      const double seconds = now() - t0;
      const auto st = batcher.stats();
      nlohmann::ordered_json row;
      row["max_batch"] = mb;
      row["seconds"] = seconds;
      row["tokens_per_second"] = static_cast<double>(tokens) / seconds;
      row["speedup_vs_one_at_a_time"] = sequential / seconds;
      const double batch_flops = engine.flops() - flops_before;
      row["gflops"] = batch_flops / seconds / 1e9;
      // The same passes per sequence as one at a time, or the arithmetic bound would not apply.
      if (!profile && std::abs(batch_flops - flops) > 1e-9 * flops) {
        std::fprintf(stderr, "max_batch %d counted %.6g FLOP against %.6g one at a time\n", mb, batch_flops, flops);
        return 1;
      }
      row["passes"] = st.passes;
      row["denoise_passes"] = st.denoise_passes;
      row["mean_sequences_per_denoise_pass"] =
          st.denoise_passes ? static_cast<double>(st.denoise_steps) / static_cast<double>(st.denoise_passes) : 0.0;
      row["identical_answers"] = profile || got == reference;
      rows.push_back(row);
      std::fprintf(stderr, "max_batch %2d: %.3f s (one at a time %.3f s) -> %.2fx, identical %s\n", mb, seconds,
                   sequential, sequential / seconds, got == reference ? "yes" : "NO");
    }
    out["batched"] = rows;
    std::cout << out.dump(2) << "\n";
    for (const auto& r : rows) {
      if (!r["identical_answers"].get<bool>()) return 1;  // a wrong answer is a failure, not a result
    }
    return 0;
  } catch (const std::exception& e) {
    std::cerr << "bench_batch: " << e.what() << "\n";
    return 1;
  }
}
