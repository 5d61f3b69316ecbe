// SPDX-License-Identifier: Apache-2.0
// Host side of the real-scale check (realscale.hpp): seeded weights, the CPU back-end's run, the
// reference file and the comparison. Compiled by the host compiler (Eigen, nlohmann stay out of nvcc).
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <sstream>
#include <thread>

#include <diffusion_gemma/core/bfloat16.hpp>
#include <diffusion_gemma/cpu/engine.hpp>
#include <diffusion_gemma/io/safetensors.hpp>
#include <diffusion_gemma/io/safetensors_writer.hpp>

#include "realscale.hpp"
#include "realscale_run.hpp"
#include "shapes.hpp"

namespace dg_realscale {

using namespace diffusion_gemma;

namespace {

constexpr int kTop = 8;
constexpr std::uint64_t kFormat = 1;  // bumped when the scenario or the file changes

std::uint64_t mix(std::uint64_t z) {  // splitmix64's finaliser
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// Approximately N(0, 1) from (key, i) alone: the sum of four 16-bit uniforms at unit variance.
float normal(std::uint64_t key, std::uint64_t i) {
  const std::uint64_t r = mix(key + 0x9E3779B97F4A7C15ull * (i + 1));
  float sum = 0.0f;
  for (int k = 0; k < 4; ++k) sum += static_cast<float>((r >> (16 * k)) & 0xffff) * (1.0f / 65536.0f);
  return (sum - 2.0f) * 1.7320508f;
}

struct Distribution {
  float mean = 0.0f, std = 0.0f;
};

Distribution distribution(const ParamSpec& p) {
  switch (p.param) {
    case Param::kEmbedTokens: return {0.0f, 0.03f};
    case Param::kLayerScalar: return {0.8f, 0.1f};
    // The router's input is scaled by hidden^-0.5 before the projection: unit-std weights give
    // routing logits of unit spread, so the top 8 of 128 are separated by more than rounding.
    case Param::kRouterProj: return {0.0f, 1.0f};
    // Gemma 4 does not scale q.k by head_dim^-0.5 (the per-head norms stand in for it): norm
    // weights of 1 would give scores of std sqrt(head_dim) = 16, an attention so sharp that any
    // rounding flips which key wins. 0.25 on q and k gives scores of unit spread, as trained.
    case Param::kQNorm:
    case Param::kKNorm: return {0.25f, 0.02f};
    default: break;
  }
  if (p.is_matrix()) return {0.0f, 1.0f / std::sqrt(static_cast<float>(p.shape.dims[p.shape.rank - 1]))};
  return {1.0f, 0.1f};  // norm weights, router scales
}

std::int32_t id(std::uint64_t key, std::uint64_t i, std::int64_t vocab) {
  return static_cast<std::int32_t>(mix(key * 0x100000001B3ull + i) % static_cast<std::uint64_t>(vocab));
}

}  // namespace

ModelConfig scenario_config(const Scenario& s) {
  ModelConfig c = dg_gpu::synthetic_config("real", s.layers);
  c.source = "realscale:layers=" + std::to_string(s.layers) + ",seed=" + std::to_string(s.seed);
  return c;
}

SeededWeights make_weights(const ModelConfig& cfg, std::uint64_t seed) {
  struct Storage {
    std::vector<std::vector<bfloat16>> tensors;
  };
  auto storage = std::make_shared<Storage>();
  SeededWeights out;
  out.weights.layers.resize(cfg.layers.size());
  struct Job {
    bfloat16* data;
    std::int64_t n;
    std::uint64_t key;
    Distribution d;
  };
  std::vector<Job> jobs;
  std::uint64_t k = 0;
  for_each_parameter(cfg, out.weights, [&](const ParamSpec& p, Weight& w) {
    storage->tensors.emplace_back(static_cast<std::size_t>(p.shape.numel()));
    auto& t = storage->tensors.back();
    w.data = reinterpret_cast<const std::byte*>(t.data());
    w.dtype = DType::kBF16;
    w.shape = p.shape;
    jobs.push_back({t.data(), p.shape.numel(), mix(seed * 0x100000001B3ull + ++k), distribution(p)});
  });
  // Pieces of 1 M elements over all threads: the values do not depend on who computes them.
  constexpr std::int64_t kPiece = 1 << 20;
  std::vector<std::pair<std::size_t, std::int64_t>> pieces;
  for (std::size_t j = 0; j < jobs.size(); ++j)
    for (std::int64_t off = 0; off < jobs[j].n; off += kPiece) pieces.emplace_back(j, off);
  std::atomic<std::size_t> next{0};
  const auto work = [&] {
    for (std::size_t p; (p = next.fetch_add(1)) < pieces.size();) {
      const Job& j = jobs[pieces[p].first];
      const std::int64_t begin = pieces[p].second, end = std::min(j.n, begin + kPiece);
      for (std::int64_t i = begin; i < end; ++i) {
        j.data[i] = bfloat16::from_float(j.d.mean + j.d.std * normal(j.key, static_cast<std::uint64_t>(i)));
      }
    }
  };
  const unsigned threads = std::max(1u, std::thread::hardware_concurrency());
  std::vector<std::thread> pool;
  for (unsigned t = 1; t < threads; ++t) pool.emplace_back(work);
  work();
  for (auto& t : pool) t.join();
  for_each_parameter(cfg, out.weights, [&](const ParamSpec&, Weight& w) { w.owner = storage; });
  out.holder = storage;
  return out;
}

std::vector<std::int32_t> prompt_ids(const Scenario& s, std::int64_t vocab) {
  std::vector<std::int32_t> ids(static_cast<std::size_t>(s.prompt));
  // Ids 0..3 are PAD / BOS / EOS-like: a prompt of ordinary tokens avoids them.
  for (std::size_t i = 0; i < ids.size(); ++i) ids[i] = 4 + id(s.seed + 11, i, vocab - 4);
  return ids;
}

std::vector<std::int32_t> canvas_ids(const Scenario& s, std::int64_t vocab, int canvas) {
  std::vector<std::int32_t> ids(256);
  for (std::size_t i = 0; i < ids.size(); ++i) ids[i] = id(s.seed + 101 + static_cast<std::uint64_t>(canvas), i, vocab);
  return ids;
}

void summarize_logits(const float* logits, std::int64_t C, std::int64_t V, const std::vector<std::int32_t>& reference_top,
                      Outputs& out) {
  out.argmax.assign(static_cast<std::size_t>(C), 0);
  out.top_ids.assign(static_cast<std::size_t>(C * kTop), 0);
  out.top_logits.assign(static_cast<std::size_t>(C * kTop), 0.0f);
  out.at_reference_top.clear();
  out.entropy.assign(static_cast<std::size_t>(C), 0.0f);
  std::vector<std::int32_t> order(static_cast<std::size_t>(V));
  for (std::int64_t c = 0; c < C; ++c) {
    const float* row = logits + c * V;
    for (std::int64_t v = 0; v < V; ++v) order[static_cast<std::size_t>(v)] = static_cast<std::int32_t>(v);
    // Largest first, ties to the smaller id (the back-ends' argmax rule).
    std::partial_sort(order.begin(), order.begin() + kTop, order.end(), [&](std::int32_t a, std::int32_t b) {
      return row[a] > row[b] || (row[a] == row[b] && a < b);
    });
    for (int k = 0; k < kTop; ++k) {
      out.top_ids[static_cast<std::size_t>(c * kTop + k)] = order[static_cast<std::size_t>(k)];
      out.top_logits[static_cast<std::size_t>(c * kTop + k)] = row[order[static_cast<std::size_t>(k)]];
    }
    out.argmax[static_cast<std::size_t>(c)] = order[0];
    const double m = row[order[0]];
    double z = 0.0, s = 0.0;
    for (std::int64_t v = 0; v < V; ++v) {
      const double d = row[v] - m, e = std::exp(d);
      z += e;
      s += e * d;
    }
    out.entropy[static_cast<std::size_t>(c)] = static_cast<float>(std::log(z) - s / z);
    if (!reference_top.empty()) {
      for (int k = 0; k < kTop; ++k) out.at_reference_top.push_back(row[reference_top[static_cast<std::size_t>(c * kTop + k)]]);
    }
  }
  out.full_rows_at = {0, 1, static_cast<std::int32_t>(C / 2), static_cast<std::int32_t>(C - 1)};
  out.full_rows.clear();
  for (std::int32_t c : out.full_rows_at) out.full_rows.insert(out.full_rows.end(), logits + c * V, logits + (c + 1) * V);
}

Outputs run_cpu(const Scenario& s, const ModelConfig& cfg, const SeededWeights& w, bool exact,
                const std::vector<std::int32_t>& reference_top, const Progress& progress) {
  auto model = cpu::Model::create(cfg, w.weights);
  cpu::EngineOptions o;
  o.precision = exact ? cpu::Precision::kExact : cpu::Precision::kFast;
  return run_scenario<cpu::Engine<DiffusionGemmaBackbone>>(s, cfg, reference_top, progress, model, o);
}

std::string cpu_description() {
  return cpu::cpu_features().brand + " (" + cpu::isa_name(cpu::default_isa()) + ")";
}

// ---- the reference file ------------------------------------------------------------------------

namespace {

void add(io::SafetensorsWriter& f, const std::string& name, const std::vector<float>& v) {
  f.add(name, DType::kF32, Shape{static_cast<std::int64_t>(v.size())}, v.data());
}
void add(io::SafetensorsWriter& f, const std::string& name, const std::vector<std::int32_t>& v) {
  f.add(name, DType::kI32, Shape{static_cast<std::int64_t>(v.size())}, v.data());
}

template <class T>
std::vector<T> read(const io::SafetensorsFile& f, const std::string& name, DType dtype) {
  const auto& t = f.at(name);
  if (t.dtype != dtype) {
    throw_error(StatusCode::kFormatError, f.path(), ": tensor '", name, "' is ", dtype_name(t.dtype), ", expected ",
                dtype_name(dtype));
  }
  std::vector<T> v(static_cast<std::size_t>(t.shape.numel()));
  if (!v.empty()) std::memcpy(v.data(), t.data, v.size() * sizeof(T));
  return v;
}

void save_outputs(io::SafetensorsWriter& f, const std::string& p, const Outputs& o) {
  add(f, p + "prompt_last_hidden", o.prompt_last_hidden);
  add(f, p + "argmax", o.argmax);
  add(f, p + "top_ids", o.top_ids);
  add(f, p + "top_logits", o.top_logits);
  add(f, p + "at_reference_top", o.at_reference_top);
  add(f, p + "entropy", o.entropy);
  add(f, p + "full_rows_at", o.full_rows_at);
  add(f, p + "full_rows", o.full_rows);
  add(f, p + "step1_argmax", o.step1_argmax);
  add(f, p + "step1_sample", o.step1_sample);
  add(f, p + "step1_entropy", o.step1_entropy);
  add(f, p + "step2_argmax", o.step2_argmax);
  add(f, p + "step2_entropy", o.step2_entropy);
  add(f, p + "generation", o.generation);
  add(f, p + "generation_forwards", std::vector<std::int32_t>{o.generation_forwards});
}

Outputs load_outputs(const io::SafetensorsFile& f, const std::string& p) {
  Outputs o;
  const auto F = [&](const std::string& n) { return read<float>(f, p + n, DType::kF32); };
  const auto I = [&](const std::string& n) { return read<std::int32_t>(f, p + n, DType::kI32); };
  o.prompt_last_hidden = F("prompt_last_hidden");
  o.argmax = I("argmax");
  o.top_ids = I("top_ids");
  o.top_logits = F("top_logits");
  o.at_reference_top = F("at_reference_top");
  o.entropy = F("entropy");
  o.full_rows_at = I("full_rows_at");
  o.full_rows = F("full_rows");
  o.step1_argmax = I("step1_argmax");
  o.step1_sample = I("step1_sample");
  o.step1_entropy = F("step1_entropy");
  o.step2_argmax = I("step2_argmax");
  o.step2_entropy = F("step2_entropy");
  o.generation = I("generation");
  const auto fw = I("generation_forwards");
  o.generation_forwards = fw.empty() ? 0 : fw[0];
  return o;
}

}  // namespace

void save_reference(const std::string& path, const Reference& r) {
  io::SafetensorsWriter f;
  f.set_metadata("format", std::to_string(kFormat));
  f.set_metadata("layers", std::to_string(r.scenario.layers));
  f.set_metadata("prompt", std::to_string(r.scenario.prompt));
  f.set_metadata("seed", std::to_string(r.scenario.seed));
  f.set_metadata("generation_prompt", std::to_string(r.scenario.generation_prompt));
  f.set_metadata("generation_steps", std::to_string(r.scenario.generation_steps));
  f.set_metadata("cpu", r.cpu);
  save_outputs(f, "exact.", r.exact);
  save_outputs(f, "fast.", r.fast);
  f.write(path);
}

Reference load_reference(const std::string& path) {
  io::SafetensorsFile f(path);
  const auto& m = f.metadata();
  const auto number = [&](const char* key) -> std::uint64_t {
    const auto it = m.find(key);
    if (it == m.end()) throw_error(StatusCode::kFormatError, path, ": metadata '", key, "' is missing");
    return std::stoull(it->second);
  };
  if (number("format") != kFormat) {
    throw_error(StatusCode::kFormatError, path, ": reference format ", number("format"), ", this program reads ", kFormat,
                " (rebuild it with scripts/gpu-build.sh)");
  }
  Reference r;
  r.scenario.layers = static_cast<int>(number("layers"));
  r.scenario.prompt = static_cast<int>(number("prompt"));
  r.scenario.seed = number("seed");
  r.scenario.generation_prompt = static_cast<int>(number("generation_prompt"));
  r.scenario.generation_steps = static_cast<int>(number("generation_steps"));
  const auto cpu = m.find("cpu");
  r.cpu = cpu == m.end() ? "" : cpu->second;
  r.exact = load_outputs(f, "exact.");
  r.fast = load_outputs(f, "fast.");
  return r;
}

// ---- comparison ---------------------------------------------------------------------------------

namespace {

double max_abs(const std::vector<float>& a, const std::vector<float>& b) {
  if (a.size() != b.size()) return INFINITY;
  double m = 0.0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    const double d = std::abs(static_cast<double>(a[i]) - b[i]);
    if (!(d <= m)) m = d;  // NaN propagates as a failure
  }
  return m;
}

double agreement(const std::vector<std::int32_t>& a, const std::vector<std::int32_t>& b) {
  if (a.size() != b.size() || a.empty()) return 0.0;
  std::size_t same = 0;
  for (std::size_t i = 0; i < a.size(); ++i) same += a[i] == b[i];
  return static_cast<double>(same) / static_cast<double>(a.size());
}

}  // namespace

Comparison compare(const Outputs& ref, const Outputs& got, const Tolerance& t) {
  Comparison c;
  c.logit_max_abs = std::max(max_abs(ref.top_logits, got.at_reference_top), max_abs(ref.full_rows, got.full_rows));
  c.entropy_max_abs = max_abs(ref.entropy, got.entropy);
  double scale = 0.0;
  for (float v : ref.prompt_last_hidden) scale = std::max(scale, static_cast<double>(std::abs(v)));
  c.hidden_rel = max_abs(ref.prompt_last_hidden, got.prompt_last_hidden) / std::max(scale, 1e-30);
  for (std::size_t i = 0; i < ref.argmax.size() && i < got.argmax.size(); ++i) {
    if (ref.argmax[i] == got.argmax[i]) continue;
    ++c.argmax_mismatches;
    const double gap = ref.top_logits[i * kTop] - ref.top_logits[i * kTop + 1];
    if (gap > 2.0 * t.logit) ++c.argmax_mismatches_unexplained;
  }
  if (ref.argmax.size() != got.argmax.size()) c.argmax_mismatches_unexplained = static_cast<int>(ref.argmax.size()) + 1;
  c.step1_argmax_agreement = agreement(ref.step1_argmax, got.step1_argmax);
  c.step2_argmax_agreement = agreement(ref.step2_argmax, got.step2_argmax);
  c.step_entropy_max_abs = std::max(max_abs(ref.step1_entropy, got.step1_entropy), max_abs(ref.step2_entropy, got.step2_entropy));
  c.generation_agreement = agreement(ref.generation, got.generation);
  c.generation_forwards_reference = ref.generation_forwards;
  c.generation_forwards = got.generation_forwards;

  std::ostringstream why;
  const auto limit = [&](const char* name, double value, double bound, bool at_most) {
    const bool ok = at_most ? value <= bound : value >= bound;
    if (!ok) why << (why.tellp() > 0 ? "; " : "") << name << " " << value << (at_most ? " > " : " < ") << bound;
  };
  limit("logit_max_abs", c.logit_max_abs, t.logit, true);
  limit("entropy_max_abs", c.entropy_max_abs, t.entropy, true);
  limit("step_entropy_max_abs", c.step_entropy_max_abs, t.entropy, true);
  limit("hidden_rel", c.hidden_rel, t.hidden, true);
  limit("argmax_mismatches_unexplained", c.argmax_mismatches_unexplained, 0, true);
  limit("step1_argmax_agreement", c.step1_argmax_agreement, t.agreement, false);
  limit("step2_argmax_agreement", c.step2_argmax_agreement, t.agreement, false);
  limit("generation_agreement", c.generation_agreement, t.agreement, false);
  c.failures = why.str();
  c.pass = c.failures.empty();
  return c;
}

std::string to_json(const Comparison& c, const Tolerance& t) {
  std::ostringstream j;
  j.precision(6);
  j << "{\"pass\": " << (c.pass ? "true" : "false") << ", \"logit_max_abs\": " << c.logit_max_abs
    << ", \"entropy_max_abs\": " << c.entropy_max_abs << ", \"step_entropy_max_abs\": " << c.step_entropy_max_abs
    << ", \"hidden_rel\": " << c.hidden_rel << ", \"argmax_mismatches\": " << c.argmax_mismatches
    << ", \"argmax_mismatches_unexplained\": " << c.argmax_mismatches_unexplained
    << ", \"step1_argmax_agreement\": " << c.step1_argmax_agreement
    << ", \"step2_argmax_agreement\": " << c.step2_argmax_agreement
    << ", \"generation_agreement\": " << c.generation_agreement
    << ", \"generation_forwards\": " << c.generation_forwards
    << ", \"generation_forwards_reference\": " << c.generation_forwards_reference << ", \"tolerance\": {\"logit\": "
    << t.logit << ", \"entropy\": " << t.entropy << ", \"hidden\": " << t.hidden << ", \"agreement\": " << t.agreement
    << "}, \"failures\": \"" << c.failures << "\"}";
  return j.str();
}

}  // namespace dg_realscale
