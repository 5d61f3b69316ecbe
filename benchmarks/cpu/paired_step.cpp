// SPDX-License-Identifier: Apache-2.0
// Two checkpoints of one model (e.g. BF16 and W4A16) timed step against step: the denoise step of
// A, then B's, repeated. A noisy machine's slow phases last seconds to minutes, so neighbouring
// steps see the same phase and the ratio of each pair cancels it; separate runs (quantized_speed.py)
// cannot resolve differences of a few percent. Prints one JSON object: per-model medians, and
// the quartiles of the per-pair ratios A / B (above 1: B is faster) with a 95 % bootstrap interval
// of their median, for the whole step, the backbone part and the vocabulary pass.
//
//   paired_step --a DIR --b DIR [--threads N] [--pairs 20] [--prompt 256] [--precision exact|fast]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include <diffusion_gemma/cpu/engine.hpp>

namespace dg = diffusion_gemma;
using Engine = dg::cpu::Engine<dg::DiffusionGemmaBackbone>;

namespace {

double now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

std::string arg(int argc, char** argv, const char* name, const std::string& fallback) {
  for (int i = 1; i + 1 < argc; ++i)
    if (std::strcmp(argv[i], name) == 0) return argv[i + 1];
  return fallback;
}

// Interpolated between the two nearest order statistics (the median of an even count is the mean
// of the middle two, not the upper one).
double quantile(std::vector<double> v, double q) {
  std::sort(v.begin(), v.end());
  const double at = q * static_cast<double>(v.size() - 1);
  const std::size_t lo = static_cast<std::size_t>(at);
  const std::size_t hi = std::min(lo + 1, v.size() - 1);
  return v[lo] + (at - static_cast<double>(lo)) * (v[hi] - v[lo]);
}

// The 2.5 % and 97.5 % points of the median of `v` resampled with replacement (fixed seed).
std::vector<double> median_interval(const std::vector<double>& v) {
  std::mt19937 gen(7);
  std::uniform_int_distribution<std::size_t> pick(0, v.size() - 1);
  std::vector<double> medians, sample(v.size());
  for (int b = 0; b < 2000; ++b) {
    for (double& x : sample) x = v[pick(gen)];
    medians.push_back(quantile(sample, 0.5));
  }
  return {quantile(medians, 0.025), quantile(medians, 0.975)};
}

// One model with its engine, cache (prompt encoded) and step buffers.
struct Side {
  std::shared_ptr<const dg::cpu::Model> model;
  std::unique_ptr<Engine> engine;
  std::optional<dg::cpu::KvCache> cache;
  std::vector<float> hidden, soft;
  dg::VocabPassResult stats;
  std::vector<double> step, backbone, vocab;
};

void step_once(Side& s, const std::vector<std::int32_t>& canvas, std::uint32_t r, bool record) {
  const int C = static_cast<int>(canvas.size());
  const double t0 = now();
  s.engine->denoise(canvas.data(), C, s.soft.data(), *s.cache, s.hidden.data());
  const double t1 = now();
  dg::VocabPassArgs va;
  va.temperature = 0.7f;
  va.key = dg::DrawKey{1, 0, r};
  s.engine->vocab_pass(s.hidden.data(), C, va, s.stats);
  const double t2 = now();
  if (!record) return;
  s.step.push_back(t2 - t0);
  s.backbone.push_back(t1 - t0);
  s.vocab.push_back(t2 - t1);
}

}  // namespace

int main(int argc, char** argv) {
  const std::string a_dir = arg(argc, argv, "--a", ""), b_dir = arg(argc, argv, "--b", "");
  if (a_dir.empty() || b_dir.empty()) {
    std::fprintf(stderr, "usage: paired_step --a DIR --b DIR [--threads N] [--pairs 20] [--prompt 256] [--precision exact|fast]\n");
    return 2;
  }
  const int pairs = std::atoi(arg(argc, argv, "--pairs", "20").c_str());
  const int P = std::atoi(arg(argc, argv, "--prompt", "256").c_str());
  if (pairs < 1 || P < 1) {
    std::fprintf(stderr, "--pairs and --prompt must be positive\n");
    return 2;
  }
  dg::cpu::EngineOptions eo;
  eo.threads = std::atoi(arg(argc, argv, "--threads", "0").c_str());
  if (!dg::cpu::parse_precision(arg(argc, argv, "--precision", dg::cpu::precision_name(eo.precision)), &eo.precision)) {
    std::fprintf(stderr, "--precision must be exact or fast\n");
    return 2;
  }
  Side sides[2];
  const std::string dirs[2] = {a_dir, b_dir};
  for (int i = 0; i < 2; ++i) {
    Side& s = sides[i];
    s.model = dg::cpu::Model::load(dirs[i]);
    s.engine = std::make_unique<Engine>(s.model, eo);
  }
  const auto& cfg = sides[0].model->config();
  const auto& other = sides[1].model->config();
  if (other.hidden_size != cfg.hidden_size || other.vocab_size != cfg.vocab_size || other.canvas_length != cfg.canvas_length) {
    std::fprintf(stderr, "paired_step: %s and %s are not the same model shape\n", a_dir.c_str(), b_dir.c_str());
    return 2;
  }
  const int C = cfg.canvas_length;
  const std::int64_t H = cfg.hidden_size, V = cfg.vocab_size;
  std::vector<std::int32_t> prompt(static_cast<std::size_t>(P)), canvas(static_cast<std::size_t>(C));
  for (int i = 0; i < P; ++i) prompt[i] = static_cast<std::int32_t>((i * 7919 + 17) % V);
  for (int i = 0; i < C; ++i) canvas[i] = static_cast<std::int32_t>((i * 104729 + 3) % V);
  for (Side& s : sides) {
    s.cache.emplace(s.engine->make_cache(P + C));
    s.engine->encode(prompt.data(), P, *s.cache);
    s.hidden.assign(static_cast<std::size_t>(C * H), 0.0f);
    s.soft.assign(static_cast<std::size_t>(C * H), 0.01f);
    step_once(s, canvas, 0, false);  // warm-up
  }
  for (int r = 0; r < pairs; ++r) {
    // Alternate which side goes first, so neither always follows the other.
    const int first = r % 2;
    step_once(sides[first], canvas, static_cast<std::uint32_t>(r + 1), true);
    step_once(sides[1 - first], canvas, static_cast<std::uint32_t>(r + 1), true);
    std::fprintf(stderr, "pair %d: A %.3f s, B %.3f s\n", r, sides[0].step.back(), sides[1].step.back());
  }
  nlohmann::ordered_json out;
  out["a"] = a_dir;
  out["b"] = b_dir;
  out["cpu"] = dg::cpu::cpu_features().brand;
  out["cpu_flags"] = dg::cpu::cpu_features().flags();
  out["threads"] = dg::cpu::resolve_threads(eo.threads);
  out["kernels"] = sides[0].engine->kernels().path();
  out["pairs"] = pairs;
  const char* names[3] = {"step", "backbone", "vocab_pass"};
  for (int q = 0; q < 3; ++q) {
    const auto series = [&](Side& s) -> std::vector<double>& { return q == 0 ? s.step : q == 1 ? s.backbone : s.vocab; };
    std::vector<double> ratio;
    for (int r = 0; r < pairs; ++r) ratio.push_back(series(sides[0])[r] / series(sides[1])[r]);
    out[std::string(names[q]) + "_a_seconds"] = quantile(series(sides[0]), 0.5);
    out[std::string(names[q]) + "_b_seconds"] = quantile(series(sides[1]), 0.5);
    out[std::string(names[q]) + "_ratio_a_over_b"] = {quantile(ratio, 0.25), quantile(ratio, 0.5), quantile(ratio, 0.75)};
    out[std::string(names[q]) + "_ratio_median_95"] = median_interval(ratio);
  }
  std::printf("%s\n", out.dump().c_str());
  return 0;
}
