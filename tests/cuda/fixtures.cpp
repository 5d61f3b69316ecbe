// SPDX-License-Identifier: Apache-2.0
// Host side of the CUDA tests (see fixtures.hpp): io/ loading, golden tensors, replay runs and the
// CPU oracle. Compiled by the host compiler; never sees a CUDA header.
#include "fixtures.hpp"

#include <fstream>

#include <nlohmann/json.hpp>

#include <diffusion_gemma/cpu/engine.hpp>
#include <diffusion_gemma/io/config.hpp>
#include <diffusion_gemma/io/draws.hpp>
#include <diffusion_gemma/io/safetensors.hpp>
#include <diffusion_gemma/io/weights.hpp>
#include <diffusion_gemma/runtime/decoder.hpp>

#include "support/golden.hpp"

namespace dg_cuda_test {

using namespace diffusion_gemma;

HostCheckpoint load_checkpoint(const std::string& dir) {
  HostCheckpoint h;
  h.config = io::load_model_config(dir);
  h.generation = io::load_generation_config(dir);
  auto ckpt = std::make_shared<io::Checkpoint>(dir);
  h.weights = io::bind_weights(*ckpt, h.config);
  const DType t = h.weights.embed_tokens.dtype;
  const float root = std::sqrt(static_cast<float>(h.config.hidden_size));
  h.embed_scale = t == DType::kBF16  ? round_to_bfloat16(root)
                  : t == DType::kF16 ? float16::from_float(root).to_float()
                                     : root;
  h.holder = ckpt;
  return h;
}

namespace {

RawTensor view(const cpu::FloatTensor& t) {
  RawTensor r;
  if (t.empty()) return r;
  r.data = reinterpret_cast<const std::byte*>(t.data());
  r.dtype = DType::kF32;
  r.shape = t.shape();
  r.nbytes = static_cast<std::size_t>(t.shape().numel()) * 4;
  return r;
}

}  // namespace

HostCheckpoint from_cpu_model(const std::string& dir) {
  auto m = cpu::Model::load(dir);
  HostCheckpoint h;
  h.config = m->config();
  h.generation = m->generation_config();
  h.embed_scale = m->embed_scale();
  ModelWeights& w = h.weights;
  w.embed_tokens = view(m->embed_tokens());
  w.final_norm = view(m->final_norm());
  w.layers.resize(static_cast<std::size_t>(h.config.num_layers()));
  // layer_scalar is a plain float in cpu::Model: keep copies alive next to the model.
  auto scalars = std::make_shared<std::vector<float>>(w.layers.size());
  for (std::size_t l = 0; l < w.layers.size(); ++l) {
    const cpu::LayerParams& s = m->layer(static_cast<int>(l));
    LayerWeights& d = w.layers[l];
    d.q_proj = view(s.q_proj);
    d.k_proj = view(s.k_proj);
    d.v_proj = view(s.v_proj);
    d.o_proj = view(s.o_proj);
    d.q_norm = view(s.q_norm);
    d.k_norm = view(s.k_norm);
    d.input_layernorm = view(s.input_layernorm);
    d.post_attention_layernorm = view(s.post_attention_layernorm);
    d.pre_feedforward_layernorm = view(s.pre_feedforward_layernorm);
    d.post_feedforward_layernorm = view(s.post_feedforward_layernorm);
    d.post_feedforward_layernorm_1 = view(s.post_feedforward_layernorm_1);
    d.pre_feedforward_layernorm_2 = view(s.pre_feedforward_layernorm_2);
    d.post_feedforward_layernorm_2 = view(s.post_feedforward_layernorm_2);
    d.mlp_gate = view(s.mlp_gate);
    d.mlp_up = view(s.mlp_up);
    d.mlp_down = view(s.mlp_down);
    d.router_proj = view(s.router_proj);
    d.router_scale = view(s.router_scale);
    d.router_per_expert_scale = view(s.router_per_expert_scale);
    d.experts_gate_up = view(s.experts_gate_up);
    d.experts_down = view(s.experts_down);
    (*scalars)[l] = s.layer_scalar;
    d.layer_scalar.data = reinterpret_cast<const std::byte*>(&(*scalars)[l]);
    d.layer_scalar.dtype = DType::kF32;
    d.layer_scalar.shape = Shape{1};
    d.layer_scalar.nbytes = 4;
  }
  w.self_conditioning.pre_norm = view(m->sc_pre_norm());
  w.self_conditioning.gate_proj = view(m->sc_gate());
  w.self_conditioning.up_proj = view(m->sc_up());
  w.self_conditioning.down_proj = view(m->sc_down());
  using Holder = std::pair<std::shared_ptr<const cpu::Model>, std::shared_ptr<std::vector<float>>>;
  h.holder = std::make_shared<Holder>(m, scalars);
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
  if (impl_->model->config().enable_moe_block) {
    impl_->moe = std::make_unique<cpu::Engine<DiffusionGemmaBackbone>>(impl_->model);
  } else {
    impl_->dense = std::make_unique<cpu::Engine<Gemma4DenseBackbone>>(impl_->model);
  }
}
CpuReference::~CpuReference() = default;

const ModelConfig& CpuReference::config() const { return impl_->model->config(); }
float CpuReference::embed_scale() const { return impl_->model->embed_scale(); }
const float* CpuReference::embed_tokens() const { return impl_->model->embed_tokens().data(); }

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
  VocabPassResult r;
  pass.run(E.data(), V, H, cap, embed_scale, hidden.data(), C, args, r);
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
  r.scheduler.max_new_tokens = s.at("max_new_tokens").get<int>();
  r.sampler.max_denoising_steps = s.at("max_denoising_steps").get<int>();
  r.sampler.schedule.t_min = s.at("t_min").get<double>();
  r.sampler.schedule.t_max = s.at("t_max").get<double>();
  r.sampler.stopping.stability_threshold = s.at("stability_threshold").get<int>();
  r.sampler.stopping.confidence_threshold = s.at("confidence_threshold").get<double>();
  r.sampler.acceptance.entropy_bound = s.at("sampler_config").at("entropy_bound").get<double>();
  r.scheduler.stop_token_ids = s.at("eos_token_id").get<std::vector<int>>();
  r.scheduler.pad_token_id = s.at("pad_token_id").get<int>();
  r.sampler.rng.draws = draws.draws;
  return r;
}

}  // namespace dg_cuda_test
