// SPDX-License-Identifier: Apache-2.0
// First timing of one denoising step on the GPU: the denoiser pass over a canvas plus the
// streaming vocabulary pass (Engine::denoise_step, as the Decoder drives it), after a prompt has
// been encoded. Either a checkpoint directory or a synthetic configuration whose random weights
// are created on the device (no checkpoint, no host copy):
//
//   dg_gpu_first_step --fixture tests/fixtures/dg_wide --dtype f32 --json out.json
//   dg_gpu_first_step --synthetic small --json out.json   hidden 1024, canvas 256, vocab 262144
//   dg_gpu_first_step --synthetic real  --json out.json   the 26B-A4B shapes (about 50 GB in BF16)
//   ... --generate-steps 16   also one commit and a whole generation (prefill + one canvas)
//
// Prints one JSON object (and writes it with --json): median / min step time, the split into
// denoiser and vocabulary pass (CUDA events), and the time it takes to read every parameter once
// at an assumed HBM bandwidth, the bound a memory-bound step approaches.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include <diffusion_gemma/cuda/cuda.cuh>
#include <diffusion_gemma/runtime/decoder.hpp>

#include "load.hpp"
#include "shapes.hpp"

using namespace diffusion_gemma;
namespace dc = diffusion_gemma::cuda;

namespace {

struct Options {
  std::string fixture;
  std::string synthetic;
  std::string json;
  DType dtype = DType::kBF16;
  int steps = 10;
  int prompt = 512;
  int generate_steps = 0;  // > 0: also time a whole generation of one canvas with this many steps
  double hbm_bytes_per_s = 4.8e12;  // H200 HBM3e
};

[[noreturn]] void usage(const char* why) {
  std::fprintf(stderr,
               "dg_gpu_first_step: %s\n"
               "usage: dg_gpu_first_step (--fixture DIR | --synthetic small|real) [--dtype bf16|f32] [--steps N]\n"
               "                         [--prompt P] [--generate-steps N] [--hbm-gbps G] [--json FILE]\n",
               why);
  std::exit(2);
}

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    const auto value = [&]() -> std::string {
      if (i + 1 >= argc) usage(("missing value after " + a).c_str());
      return argv[++i];
    };
    if (a == "--fixture") {
      o.fixture = value();
    } else if (a == "--synthetic") {
      o.synthetic = value();
    } else if (a == "--json") {
      o.json = value();
    } else if (a == "--dtype") {
      const std::string d = value();
      if (d == "bf16") {
        o.dtype = DType::kBF16;
      } else if (d == "f32") {
        o.dtype = DType::kF32;
      } else {
        usage("--dtype is bf16 or f32");
      }
    } else if (a == "--steps") {
      o.steps = std::max(1, std::atoi(value().c_str()));
    } else if (a == "--prompt") {
      o.prompt = std::max(1, std::atoi(value().c_str()));
    } else if (a == "--generate-steps") {
      o.generate_steps = std::max(0, std::atoi(value().c_str()));
    } else if (a == "--hbm-gbps") {
      o.hbm_bytes_per_s = std::atof(value().c_str()) * 1e9;
    } else {
      usage(("unknown option " + a).c_str());
    }
  }
  if (o.fixture.empty() == o.synthetic.empty()) usage("give exactly one of --fixture and --synthetic");
  return o;
}

// Random parameters on the device: matrices uniform with variance 1/fan_in, vectors 1.
void fill_random(dc::Model& m, std::uint64_t seed) {
  const ModelConfig& c = m.config();
  std::uint32_t id = 0;
  m.for_each_parameter([&](const std::string& name, const dc::TensorRef& ref, bool is_vector) {
    ++id;
    void* p = m.mutable_ptr(ref);
    float fan_in = static_cast<float>(c.hidden_size);
    if (name.find("o_proj") != std::string::npos) fan_in = static_cast<float>(c.num_heads * 512);
    if (name.find("mlp.down") != std::string::npos || name.find("self_conditioning.down") != std::string::npos) {
      fan_in = static_cast<float>(c.intermediate_size);
    }
    if (name.find("experts.down") != std::string::npos) fan_in = static_cast<float>(c.moe_intermediate_size);
    const float amplitude = name == "embed_tokens" ? 1.0f : std::sqrt(3.0f / fan_in);
    const float scale = is_vector ? 0.0f : amplitude, offset = is_vector ? 1.0f : 0.0f;
    Status s = ref.dtype == DType::kF32
                   ? dc::launch_fill_uniform(static_cast<float*>(p), ref.count, seed, id, scale, offset, nullptr)
                   : dc::launch_fill_uniform(static_cast<bfloat16*>(p), ref.count, seed, id, scale, offset, nullptr);
    throw_if_error(s);
  });
  DG_CUDA_CHECK(cudaDeviceSynchronize());
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  const Options o = parse(argc, argv);
  int devices = 0;
  if (const cudaError_t err = cudaGetDeviceCount(&devices); err != cudaSuccess || devices == 0) {
    std::fprintf(stderr, "dg_gpu_first_step: no CUDA device (%s): nothing timed\n",
                 err != cudaSuccess ? cudaGetErrorString(err) : "cudaGetDeviceCount reports 0 devices");
    return 77;  // as dg_cuda_tests: scripts/gpu-check.sh reports the step skipped
  }
  try {
    using clock = std::chrono::steady_clock;
    const auto ms_since = [](clock::time_point t) {
      return std::chrono::duration<double, std::milli>(clock::now() - t).count();
    };
    const auto t_load = clock::now();
    std::shared_ptr<const dc::Model> model;
    std::string name;
    if (!o.fixture.empty()) {
      const dg_bench::HostCheckpoint h = dg_bench::load_checkpoint(o.fixture);
      dc::ModelOptions mo;
      mo.dtype = o.dtype;
      model = dc::Model::create(h.config, h.weights, mo, h.generation);
      name = o.fixture;
    } else {
      dc::ModelOptions mo;
      mo.dtype = o.dtype;
      auto m = dc::Model::uninitialized(dg_gpu::synthetic_config(o.synthetic), mo);
      fill_random(*m, 2026);
      model = m;
      name = "synthetic:" + o.synthetic;
    }
    const double load_ms = ms_since(t_load);
    const ModelConfig& cfg = model->config();
    dc::Engine<DiffusionGemmaBackbone> engine(model);
    const int C = cfg.canvas_length;
    const int P = static_cast<int>(std::min<std::int64_t>(o.prompt, cfg.max_position_embeddings - C));
    std::mt19937 rng(7);
    std::vector<std::int32_t> prompt(static_cast<std::size_t>(P)), canvas(static_cast<std::size_t>(C));
    for (auto& t : prompt) t = static_cast<std::int32_t>(rng() % cfg.vocab_size);
    for (auto& t : canvas) t = static_cast<std::int32_t>(rng() % cfg.vocab_size);

    dc::KvCache cache = engine.make_cache(P + C);
    const auto t_enc = clock::now();
    engine.encode(prompt.data(), P, cache);
    const double encode_ms = ms_since(t_enc);

    VocabPassResult stats;
    std::vector<double> step_ms;
    for (int s = 0; s <= o.steps; ++s) {  // step 0 warms up (cuBLAS heuristics, lazy module loading)
      VocabPassArgs args;
      args.temperature = math::linear_temperature(0.4f, 0.4f, 48 - s, 48);
      args.key = DrawKey{1, 0, static_cast<std::uint32_t>(s)};
      const auto t = clock::now();
      engine.denoise_step(canvas.data(), C, s == 0, cache, args, stats);
      if (s > 0) step_ms.push_back(ms_since(t));
      canvas = stats.sample;
    }

    // The split, on the device's clock.
    dc::Event e0, e1, e2;
    dc::DeviceBuffer<std::int32_t> ids(static_cast<std::size_t>(C), "canvas");
    dc::DeviceBuffer<float> hidden(static_cast<std::size_t>(C) * cfg.hidden_size, "hidden");
    dc::DeviceBuffer<float> soft(static_cast<std::size_t>(C) * cfg.hidden_size, "soft");
    dc::DeviceBuffer<std::int32_t> argmax(static_cast<std::size_t>(C), "argmax");
    dc::DeviceBuffer<std::int32_t> sample(static_cast<std::size_t>(C), "sample");
    dc::DeviceBuffer<float> entropy(static_cast<std::size_t>(C), "entropy");
    ids.upload(canvas.data(), canvas.size());
    VocabPassArgs args;
    args.temperature = 0.6f;
    e0.record(engine.stream());
    engine.denoise_device(ids.data(), C, nullptr, cache, hidden.data());
    e1.record(engine.stream());
    engine.vocab_pass_device(hidden.data(), C, args, argmax.data(), sample.data(), entropy.data(), soft.data());
    e2.record(engine.stream());
    e2.synchronize();
    const double denoise_ms = e1.elapsed_ms_since(e0), vocab_ms = e2.elapsed_ms_since(e1);

    // One commit: the canvas appended to the cache by a causal pass (what the Decoder does after
    // a canvas settles). The cache was sized for the prompt and one canvas.
    const auto t_commit = clock::now();
    engine.encode(canvas.data(), C, cache);
    const double commit_ms = ms_since(t_commit);

    // A whole generation: prefill, then one canvas of --generate-steps denoising steps (random
    // weights never settle, so every step runs), through the unchanged Decoder.
    double generation_ms = 0.0, generation_bound_ms = 0.0;
    int generation_forwards = 0;
    const double bytes = static_cast<double>(model->bytes());
    const double embed_bytes = static_cast<double>(cfg.vocab_size) * cfg.hidden_size * dtype_size(o.dtype);
    // A step streams every parameter (with 256 tokens x top-k nearly every expert is routed to);
    // a causal pass skips the vocabulary pass, so it reads the embedding table only row by row.
    const double bound_ms = bytes / o.hbm_bytes_per_s * 1e3;
    const double commit_bound_ms = (bytes - embed_bytes) / o.hbm_bytes_per_s * 1e3;
    if (o.generate_steps > 0) {
      Decoder<dc::Engine<DiffusionGemmaBackbone>> decoder(model);
      auto go = Decoder<dc::Engine<DiffusionGemmaBackbone>>::default_options(GenerationConfig{});
      go.sampler.max_denoising_steps = o.generate_steps;
      go.sampler.stopping.stability_threshold = o.generate_steps + 1;  // never stop early
      go.scheduler.max_new_tokens = C;
      const auto t_gen = clock::now();
      const GenerationResult g = decoder.generate(prompt, go);
      generation_ms = ms_since(t_gen);
      generation_forwards = g.forwards;
      const double prefill_passes = std::ceil(static_cast<double>(P) / 256.0);
      generation_bound_ms = g.forwards * bound_ms + prefill_passes * commit_bound_ms;
    }
    cudaDeviceProp prop{};
    DG_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
    char buf[2048];
    std::snprintf(buf, sizeof buf,
                  "{\"model\": \"%s\", \"device\": \"%s\", \"dtype\": \"%s\", \"hidden\": %d, \"layers\": %d, "
                  "\"vocab\": %lld, \"canvas\": %d, \"prompt\": %d, \"parameter_bytes\": %.0f, \"load_ms\": %.1f, "
                  "\"encode_ms\": %.3f, \"steps\": %d, \"step_ms_median\": %.3f, \"step_ms_min\": %.3f, "
                  "\"denoise_pass_ms\": %.3f, \"vocab_pass_ms\": %.3f, \"all_parameters_once_ms\": %.3f, "
                  "\"commit_ms\": %.3f, \"commit_bound_ms\": %.3f, \"generation_steps\": %d, "
                  "\"generation_forwards\": %d, \"generation_ms\": %.1f, \"generation_bound_ms\": %.1f, "
                  "\"assumed_hbm_gbps\": %.0f}",
                  name.c_str(), prop.name, dtype_name(o.dtype), cfg.hidden_size, cfg.num_layers(),
                  static_cast<long long>(cfg.vocab_size), C, P, bytes, load_ms, encode_ms, o.steps, median(step_ms),
                  *std::min_element(step_ms.begin(), step_ms.end()), denoise_ms, vocab_ms, bound_ms, commit_ms,
                  commit_bound_ms, o.generate_steps, generation_forwards, generation_ms, generation_bound_ms,
                  o.hbm_bytes_per_s / 1e9);
    std::printf("%s\n", buf);
    if (!o.json.empty()) {
      FILE* f = std::fopen(o.json.c_str(), "w");
      if (f == nullptr) throw_error(StatusCode::kIoError, o.json, ": cannot be written");
      std::fprintf(f, "%s\n", buf);
      std::fclose(f);
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "dg_gpu_first_step: %s\n", e.what());
    return 1;
  }
  return 0;
}
