// SPDX-License-Identifier: Apache-2.0
// Host side of the CUDA tests (see fixtures.hpp): io/ loading, golden tensors, replay runs and the
// CPU oracle. Compiled by the host compiler; never sees a CUDA header.
#include "fixtures.hpp"

#include <fstream>

#include <nlohmann/json.hpp>

#include <diffusion_gemma/cpu/engine.hpp>
#include <diffusion_gemma/io/config.hpp>
#include <diffusion_gemma/io/draws.hpp>
#include <diffusion_gemma/io/load.hpp>
#include <diffusion_gemma/io/safetensors.hpp>
#include <diffusion_gemma/runtime/decoder.hpp>

#include "support/golden.hpp"
#include "support/replay_settings.hpp"

namespace dg_cuda_test {

using namespace diffusion_gemma;

HostCheckpoint load_checkpoint(const std::string& dir) {
  io::LoadedCheckpoint c = io::load_checkpoint(dir);
  HostCheckpoint h;
  h.config = c.config;
  h.generation = c.generation;
  h.weights = c.weights;
  h.embed_scale = c.embed_scale;
  h.holder = c.checkpoint;
  return h;
}

Golden::Golden(const std::string& path) : file_(std::make_shared<io::SafetensorsFile>(path)) {}

std::vector<float> Golden::floats(const std::string& name) const {
  return dg_test::floats(*static_cast<const io::SafetensorsFile*>(file_.get()), name);
}
std::vector<std::int32_t> Golden::ids(const std::string& name) const {
  return dg_test::ids(*static_cast<const io::SafetensorsFile*>(file_.get()), name);
}
bool Golden::has(const std::string& name) const {
  return static_cast<const io::SafetensorsFile*>(file_.get())->find(name) != nullptr;
}

struct CpuReference::Impl {
  std::shared_ptr<const cpu::Model> model;
  std::vector<float> embed_f32;  // the table widened, for oracles that take fp32
  std::unique_ptr<cpu::Engine<DiffusionGemmaBackbone>> moe;
  std::unique_ptr<cpu::Engine<Gemma4DenseBackbone>> dense;
  cpu::KvCache cache;

  template <class F>
  decltype(auto) with_engine(F&& f) {
    if (moe) return f(*moe);
    return f(*dense);
  }
};

CpuReference::CpuReference(const std::string& dir) : impl_(std::make_unique<Impl>()) {
  impl_->model = cpu::Model::load(dir);
  const Weight& E = impl_->model->weights().embed_tokens;
  impl_->embed_f32.resize(static_cast<std::size_t>(E.numel()));
  for (std::int64_t i = 0; i < E.numel(); ++i) impl_->embed_f32[static_cast<std::size_t>(i)] = E.at(i);
  cpu::EngineOptions exact;  // the oracle: fp32 activations
  exact.precision = cpu::Precision::kExact;
  if (impl_->model->config().enable_moe_block) {
    impl_->moe = std::make_unique<cpu::Engine<DiffusionGemmaBackbone>>(impl_->model, exact);
  } else {
    impl_->dense = std::make_unique<cpu::Engine<Gemma4DenseBackbone>>(impl_->model, exact);
  }
}
CpuReference::~CpuReference() = default;

const ModelConfig& CpuReference::config() const { return impl_->model->config(); }
float CpuReference::embed_scale() const { return impl_->model->embed_scale(); }
const float* CpuReference::embed_tokens() const { return impl_->embed_f32.data(); }

void CpuReference::reset_cache(std::int64_t capacity) { impl_->cache = cpu::KvCache(config(), capacity); }
std::int64_t CpuReference::cache_length() const { return impl_->cache.length(); }

std::vector<float> CpuReference::encode(const std::vector<std::int32_t>& ids) {
  std::vector<float> hidden(ids.size() * static_cast<std::size_t>(config().hidden_size));
  impl_->with_engine([&](auto& e) {
    e.encode(ids.data(), static_cast<std::int64_t>(ids.size()), impl_->cache, hidden.data());
  });
  return hidden;
}

std::vector<float> CpuReference::denoise(const std::vector<std::int32_t>& ids, const float* soft) {
  std::vector<float> hidden(ids.size() * static_cast<std::size_t>(config().hidden_size));
  impl_->with_engine([&](auto& e) {
    e.denoise(ids.data(), static_cast<std::int64_t>(ids.size()), soft, impl_->cache, hidden.data());
  });
  return hidden;
}

std::vector<float> CpuReference::lm_head(const std::vector<float>& hidden, std::int64_t n) {
  std::vector<float> logits(static_cast<std::size_t>(n * config().vocab_size));
  impl_->with_engine([&](auto& e) { e.lm_head(hidden.data(), n, logits.data()); });
  return logits;
}

VocabPassResult CpuReference::vocab_pass(const std::vector<float>& hidden, std::int64_t n, const VocabPassArgs& args) {
  VocabPassResult r;
  impl_->with_engine([&](auto& e) { e.vocab_pass(hidden.data(), n, args, r); });
  return r;
}

VocabPassResult CpuReference::denoise_step(const std::vector<std::int32_t>& canvas, bool first_step,
                                           const VocabPassArgs& args) {
  VocabPassResult r;
  impl_->with_engine([&](auto& e) {
    e.denoise_step(canvas.data(), static_cast<std::int64_t>(canvas.size()), first_step, impl_->cache, args, r);
  });
  return r;
}

VocabPassResult cpu_vocab_pass(const std::vector<float>& E, std::int64_t V, std::int64_t H, float cap,
                               float embed_scale, const std::vector<float>& hidden, std::int64_t C,
                               const VocabPassArgs& args) {
  cpu::VocabPass pass;
  cpu::KernelContext ctx;
  ctx.isa = cpu::default_isa();
  Weight table;
  table.data = reinterpret_cast<const std::byte*>(E.data());
  table.dtype = DType::kF32;
  table.shape = Shape{V, H};
  VocabPassResult r;
  pass.run(ctx, table, cap, embed_scale, hidden.data(), C, args, r);
  return r;
}

ReplayRun load_replay(const std::string& checkpoint_dir, const std::string& run) {
  const std::string base = checkpoint_dir + "/replay/" + run;
  const auto draws = io::load_draws(base + ".draws.safetensors");
  const GenerationConfig g = io::load_generation_config(checkpoint_dir);
  std::ifstream in(base + ".json");
  if (!in.good()) throw_error(StatusCode::kNotFound, base, ".json cannot be read");
  const auto j = nlohmann::json::parse(in);
  ReplayRun r;
  r.prompt = draws.prompt_ids;
  r.tokens = j.at("tokens").get<std::vector<std::int32_t>>();
  r.steps = j.at("steps").get<std::vector<int>>();
  r.stop = j.at("stop").get<std::vector<std::string>>();
  using ReplayDecoder = Decoder<cpu::Engine<DiffusionGemmaBackbone>, ReplaySampler>;
  const ReplayDecoder::Options o = ReplayDecoder::default_options(g);
  r.sampler = o.sampler;
  r.scheduler = o.scheduler;
  const auto& s = j.at("settings");
  dg_test::apply_replay_settings(s, r);
  r.sampler.rng.draws = draws.draws;
  return r;
}

}  // namespace dg_cuda_test
