// SPDX-License-Identifier: Apache-2.0
// CPU measurements of one checkpoint, printed as one JSON object (benchmarks/cpu/run.py runs it
// side by side with transformers and prints the ratios):
//   step:     one denoise step: denoiser pass + streaming vocabulary pass + sampler (median)
//   commit:   one encoder pass over a canvas after the prompt (median)
//   prefill:  the prompt through the encoder (median)
//   generate: a whole generation at a fixed number of steps per canvas
//   ar:       autoregressive decoding on the same backbone (tokens/s)
//   peak_rss: the process's peak resident memory after load + the generation (run first), after
//             everything, and the weights + KV cache they needed
//   flops:    the model arithmetic of each row (visible attention keys only), the achieved GFLOP/s,
//             and this CPU's peak for the precision, measured by our own loops (peak.hpp)
//
//   bench_cpu --model DIR [--threads N] [--repeats R] [--prompt 512] [--steps 16] [--canvases 2] [--ar-tokens 32]
//             [--precision exact|fast] [--only step,commit,prefill,generate,ar]
//             [--pass-tokens N]  (EngineOptions::max_pass_tokens)
// The kernel family is the CPU's best, or DG_CPU_ISA's.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include <diffusion_gemma/cpu/engine.hpp>
#include <diffusion_gemma/runtime/autoregressive.hpp>
#include <diffusion_gemma/runtime/decoder.hpp>

#include "model_flops.hpp"
#include "peak.hpp"

namespace dg = diffusion_gemma;
using Engine = dg::cpu::Engine<dg::DiffusionGemmaBackbone>;
using FixedSampler = dg::Sampler<dg::UniformState, dg::SelfConditioning, dg::EntropyBound, dg::LinearTemperature,
                                 dg::FixedSteps>;

namespace {

double now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

long peak_rss_kib() {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("VmHWM:", 0) == 0) return std::atol(line.c_str() + 6);
  }
  return -1;
}

std::string arg(int argc, char** argv, const char* name, const std::string& fallback) {
  for (int i = 1; i + 1 < argc; ++i)
    if (std::strcmp(argv[i], name) == 0) return argv[i + 1];
  return fallback;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string dir = arg(argc, argv, "--model", "");
  if (dir.empty()) {
    std::fprintf(stderr, "usage: bench_cpu --model DIR [--threads N] [--repeats R] [--prompt P] [--steps S] [--pass-tokens N]\n");
    return 2;
  }
  const int threads = std::atoi(arg(argc, argv, "--threads", "0").c_str());
  const int repeats = std::atoi(arg(argc, argv, "--repeats", "5").c_str());
  const int P = std::atoi(arg(argc, argv, "--prompt", "512").c_str());
  const int steps = std::atoi(arg(argc, argv, "--steps", "16").c_str());
  const int canvases = std::atoi(arg(argc, argv, "--canvases", "2").c_str());
  const int ar_tokens = std::atoi(arg(argc, argv, "--ar-tokens", "32").c_str());
  const std::string only = arg(argc, argv, "--only", "");
  dg::cpu::Precision precision = dg::cpu::EngineOptions{}.precision;
  if (!dg::cpu::parse_precision(arg(argc, argv, "--precision", dg::cpu::precision_name(precision)), &precision)) {
    std::fprintf(stderr, "--precision must be exact or fast\n");
    return 2;
  }
  const auto want = [&](const char* what) { return only.empty() || only.find(what) != std::string::npos; };

  double t = now();
  auto model = dg::cpu::Model::load(dir);
  const double load_seconds = now() - t;
  const auto& cfg = model->config();
  const int C = cfg.canvas_length;
  const std::int64_t H = cfg.hidden_size, V = cfg.vocab_size;
  dg::cpu::EngineOptions eo;
  eo.threads = threads;
  eo.precision = precision;
  const int pass_tokens = std::atoi(arg(argc, argv, "--pass-tokens", "0").c_str());
  if (pass_tokens > 0) eo.max_pass_tokens = pass_tokens;

  std::vector<std::int32_t> prompt(static_cast<std::size_t>(P)), canvas(static_cast<std::size_t>(C));
  for (int i = 0; i < P; ++i) prompt[i] = static_cast<std::int32_t>((i * 7919 + 17) % V);
  for (int i = 0; i < C; ++i) canvas[i] = static_cast<std::int32_t>((i * 104729 + 3) % V);
  nlohmann::ordered_json out;
  out["model"] = dir;
  out["threads"] = dg::cpu::resolve_threads(threads);
  out["load_seconds"] = load_seconds;
  out["cpu"] = dg::cpu::cpu_features().brand;
  out["cpu_flags"] = dg::cpu::cpu_features().flags();
  out["weights_dtype"] = dg::dtype_name(model->weight_dtype());

  if (want("generate")) {
    dg::Decoder<Engine, FixedSampler> decoder(model, eo);
    auto o = decoder.default_options(model->generation_config());
    o.sampler.max_denoising_steps = steps;
    o.scheduler.max_new_tokens = canvases * C;
    o.scheduler.stop_token_ids = {static_cast<int>(V) + 1};  // never stop early: a fixed amount of work
    const auto r = decoder.generate(prompt, o);
    out["generate_steps_per_canvas"] = steps;
    out["generate_canvases"] = canvases;
    out["generate_seconds"] = r.seconds;
    out["generate_tokens"] = r.tokens.size();
    out["generate_tokens_per_second"] = static_cast<double>(r.tokens.size()) / (r.seconds - r.prefill_seconds);
    // The memory target is about one generation: measured before anything else has run in this process.
    out["generate_peak_rss_bytes"] = static_cast<double>(peak_rss_kib()) * 1024.0;
  }
  Engine engine(model, eo);
  out["isa"] = dg::cpu::isa_name(engine.kernels().isa);
  out["precision"] = dg::cpu::precision_name(precision);
  out["kernels"] = engine.kernels().path();

  auto cache = engine.make_cache(P + C);
  std::vector<double> prefill;
  for (int r = 0; r < (want("prefill") ? repeats : 1); ++r) {
    cache.truncate(0);
    t = now();
    engine.encode(prompt.data(), P, cache);
    prefill.push_back(now() - t);
  }
  if (want("prefill")) out["prefill_seconds"] = median(prefill);

  if (want("step")) {
    // One denoise step as the decoder runs it, with a self-conditioning input (every step but the first).
    std::vector<float> hidden(static_cast<std::size_t>(C * H)), soft(static_cast<std::size_t>(C * H), 0.01f);
    dg::VocabPassResult stats;
    dg::EntropyBound::State acc_state;
    std::vector<std::uint8_t> accepted(static_cast<std::size_t>(C));
    std::vector<double> step, denoise, vocab;
    for (int r = 0; r < repeats + 1; ++r) {
      const double t0 = now();
      engine.denoise(canvas.data(), C, soft.data(), cache, hidden.data());
      const double t1 = now();
      dg::VocabPassArgs va;
      va.temperature = 0.7f;
      va.key = dg::DrawKey{1, 0, static_cast<std::uint32_t>(r)};
      engine.vocab_pass(hidden.data(), C, va, stats);
      const dg::StepView view{stats.argmax.data(), stats.sample.data(), stats.entropy.data(), C, r, 48 - r};
      dg::EntropyBound::accept(dg::EntropyBound::Arguments{}, view, acc_state, accepted.data());
      const double t2 = now();
      if (r == 0) continue;  // warm-up
      denoise.push_back(t1 - t0);
      vocab.push_back(t2 - t1);
      step.push_back(t2 - t0);
    }
    out["step_seconds"] = median(step);
    out["step_denoise_seconds"] = median(denoise);
    out["step_vocab_pass_seconds"] = median(vocab);
  }
  if (want("commit")) {
    std::vector<double> commit;
    for (int r = 0; r < repeats; ++r) {
      t = now();
      engine.encode(canvas.data(), C, cache);
      commit.push_back(now() - t);
      cache.truncate(P);
    }
    out["commit_seconds"] = median(commit);
  }
  if (want("ar")) {
    dg::AutoregressiveDecoder<Engine> ar(model, eo);
    dg::AutoregressiveDecoder<Engine>::Options o;
    o.max_new_tokens = ar_tokens;
    o.stop_token_ids = {static_cast<int>(V) + 1};
    const auto r = ar.generate(prompt, o);
    out["ar_tokens"] = r.tokens.size();
    out["ar_tokens_per_second"] = static_cast<double>(r.tokens.size()) / (r.seconds - r.prefill_seconds);
  }
  // Arithmetic per row against the measured peak of the precision the rows ran in.
  const dg::cpu::KernelContext& kc = engine.kernels();
  const double peak = dg_bench::measured_peak_gflops(kc.isa, kc.bf16_tiles() || kc.bf16_dots(), kc.threads);
  out["peak_gflops"] = peak;
  out["peak_kind"] = kc.bf16_tiles() ? "AMX-BF16 tile products" : kc.bf16_dots() ? "AVX512-BF16 dot products" : "fp32 FMA";
  const auto rate = [&](const char* key, double flops) {
    if (!out.contains(std::string(key) + "_seconds")) return;
    const double g = flops / out[std::string(key) + "_seconds"].get<double>() / 1e9;
    out[std::string(key) + "_flops"] = flops;
    out[std::string(key) + "_gflops"] = g;
    if (peak > 0.0) out[std::string(key) + "_fraction_of_peak"] = g / peak;
  };
  rate("step", dg_bench::pass_flops(cfg, C, P, true, true) + dg_bench::vocab_pass_flops(cfg, C));
  rate("commit", dg_bench::pass_flops(cfg, C, P, false, false));
  rate("prefill", dg_bench::pass_flops(cfg, P, 0, false, false));
  out["weights_bytes"] = static_cast<double>(model->weight_bytes());
  out["kv_cache_bytes"] = static_cast<double>(dg::cpu::KvCache::bytes_for(cfg, P + C));
  out["generate_kv_cache_bytes"] = static_cast<double>(dg::cpu::KvCache::bytes_for(cfg, P + canvases * C));
  out["peak_rss_bytes"] = static_cast<double>(peak_rss_kib()) * 1024.0;
  if (only.find("membw") != std::string::npos) {  // after peak_rss: its buffer is 1 GiB
    // How long streaming every weight once takes at this machine's read bandwidth: the floor of a
    // step that touches every matrix (a 256-token canvas routes to nearly every expert).
    const double gbs = dg_bench::measured_read_bandwidth_gbs(engine.kernels().threads);
    out["memory_read_gbs"] = gbs;
    out["weights_stream_seconds"] = static_cast<double>(model->weight_bytes()) / (gbs * 1e9);
  }
  std::printf("%s\n", out.dump().c_str());
  return 0;
}
