// SPDX-License-Identifier: Apache-2.0
// The scratch memory of a cuda::Engine: every activation buffer of a pass of up to T tokens,
// carved from one allocation (cuda/workspace.hpp), so that the engine allocates once per size and
// request_bytes() reports exactly what a request will allocate. nvcc only (it sizes the CUB sort
// and the vocabulary pass's workspace).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include <diffusion_gemma/core/dtype.hpp>
#include <diffusion_gemma/cuda/device/convert.cuh>
#include <diffusion_gemma/cuda/launch/moe.cuh>
#include <diffusion_gemma/cuda/launch/vocab_pass.cuh>
#include <diffusion_gemma/cuda/model.hpp>
#include <diffusion_gemma/cuda/workspace.hpp>
#include <diffusion_gemma/model/config.hpp>

namespace diffusion_gemma::cuda {

// Pointers into the workspace; `void*` buffers hold the model's storage dtype (BF16 or F32).
struct EngineBuffers {
  std::int32_t* ids = nullptr;
  float *x = nullptr, *qkv = nullptr, *a = nullptr, *d = nullptr, *s = nullptr, *gu = nullptr, *hidden = nullptr;
  void *act_in = nullptr, *q = nullptr, *k = nullptr, *v = nullptr, *hidden_act = nullptr;  // storage dtype
  float *router_logits = nullptr, *slot_weight = nullptr, *expert_mid = nullptr, *expert_out = nullptr;
  int *slot_expert = nullptr, *slot_id = nullptr, *sorted_expert = nullptr, *sorted_slot = nullptr;
  int *row_of_slot = nullptr, *expert_begin = nullptr;
  void *x2 = nullptr, *expert_in = nullptr, *expert_act = nullptr;  // storage dtype
  void* sort_temp = nullptr;
  std::size_t sort_temp_bytes = 0;
  std::int32_t *argmax = nullptr, *sample = nullptr;
  float* entropy = nullptr;
  void* vocab = nullptr;
};

// Lays out the buffers of passes of up to T tokens (measures only when the carver has no base).
inline EngineBuffers carve_engine_buffers(Carver& c, const Model& model, std::int64_t T, std::int64_t vocab_tile) {
  EngineBuffers buf;
  const ModelConfig& cfg = model.config();
  const std::size_t t = static_cast<std::size_t>(T), es = dtype_size(model.dtype());
  const std::size_t H = cfg.hidden_size, I = cfg.intermediate_size, Hq = cfg.num_heads;
  std::size_t qkv = 0, qd = 0, kd = 0;
  for (int l = 0; l < cfg.num_layers(); ++l) {
    qkv = std::max<std::size_t>(qkv, static_cast<std::size_t>(model.layer(l).qkv_rows));
    const LayerSpec& s = cfg.layers[static_cast<std::size_t>(l)];
    qd = std::max<std::size_t>(qd, Hq * s.head_dim);
    kd = std::max<std::size_t>(kd, static_cast<std::size_t>(s.num_kv_heads) * s.head_dim);
  }
  buf.ids = c.take<std::int32_t>(t);
  buf.x = c.take<float>(t * H);
  buf.qkv = c.take<float>(t * qkv);
  buf.a = c.take<float>(t * H);
  buf.d = c.take<float>(t * H);
  buf.s = c.take<float>(t * H);
  buf.gu = c.take<float>(t * 2 * I);
  buf.hidden = c.take<float>(t * H);
  buf.act_in = c.take_bytes(t * std::max({H, I, qd}) * es);
  buf.q = c.take_bytes(t * qd * es);
  buf.k = c.take_bytes(t * kd * es);
  buf.v = c.take_bytes(t * kd * es);
  buf.hidden_act = c.take_bytes(t * H * es);
  if (cfg.enable_moe_block) {
    const std::size_t E = cfg.num_experts, K = cfg.top_k_experts, Im = cfg.moe_intermediate_size, TK = t * K;
    buf.router_logits = c.take<float>(t * E);
    buf.slot_weight = c.take<float>(TK);
    buf.slot_expert = c.take<int>(TK);
    buf.slot_id = c.take<int>(TK);
    buf.sorted_expert = c.take<int>(TK);
    buf.sorted_slot = c.take<int>(TK);
    buf.row_of_slot = c.take<int>(TK);
    buf.expert_begin = c.take<int>(E + 1);
    buf.x2 = c.take_bytes(t * H * es);
    buf.expert_in = c.take_bytes(TK * H * es);
    buf.expert_mid = c.take<float>(TK * 2 * Im);
    buf.expert_act = c.take_bytes(TK * Im * es);
    buf.expert_out = c.take<float>(TK * H);
    buf.sort_temp_bytes = moe_group_workspace_bytes(static_cast<int>(TK), static_cast<int>(E));
    buf.sort_temp = c.take_bytes(buf.sort_temp_bytes);
  }
  buf.argmax = c.take<std::int32_t>(t);
  buf.sample = c.take<std::int32_t>(t);
  buf.entropy = c.take<float>(t);
  const std::size_t vocab_bytes = dispatch_storage(model.dtype(), [&](auto act) {
    return vocab_pass_workspace_bytes<decltype(act)>(static_cast<int>(T), vocab_tile);
  });
  buf.vocab = c.take_bytes(vocab_bytes);
  return buf;
}

}  // namespace diffusion_gemma::cuda
