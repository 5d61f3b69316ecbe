// SPDX-License-Identifier: Apache-2.0
// The sampler's per-step canvas update for one canvas in one block (docs/sampler.md §3, §5.6, the reference
// policies of sampler/): entropy-bound acceptance (EntropyBound), re-noising of every other
// position with Philox purpose kRenoise (UniformState + PhiloxRng), the argmax-canvas stability
// test against the history (StableAndConfident, a ring of the last `stability_threshold` argmax
// canvases) and the mean-entropy confidence test. It lets a device-side loop run a whole canvas
// without a host round trip; the host Decoder applies the same policies on the host.
#pragma once

#include <cmath>
#include <cstdint>

#include <diffusion_gemma/core/macros.hpp>
#include <diffusion_gemma/core/math.hpp>
#include <diffusion_gemma/core/rng.hpp>
#include <diffusion_gemma/cuda/device/sampling.cuh>
#include <diffusion_gemma/cuda/device/sort.cuh>

namespace diffusion_gemma::cuda {

inline constexpr int kMaxCanvas = 256;  // one thread per position; the sort is one 256-key network

// Device-resident state of one canvas's stopping rule; zero it at every new canvas.
struct CanvasStepState {
  int history_count;  // argmax canvases held (<= stability_threshold)
  int history_head;   // ring slot the next argmax canvas goes to
  int stable;
  int confident;
  int stop;
  int accepted;
  float mean_entropy;
};

struct CanvasStepParams {
  const float* entropy = nullptr;          // [length]
  const std::int32_t* argmax = nullptr;    // [length]
  const std::int32_t* candidate = nullptr; // [length] sampled candidates
  int length = 0;
  float entropy_bound = 0.1f;
  DrawKey key;  // (seed, canvas, step) of the renoise draws
  std::uint32_t vocab = 0;
  int stability_threshold = 1;
  float confidence_threshold = 0.005f;
  std::int32_t* history = nullptr;  // [stability_threshold, length]
  CanvasStepState* state = nullptr;
  std::uint8_t* accepted = nullptr;      // [length]
  std::int32_t* next_canvas = nullptr;   // [length]
};

template <int kUnused = 0>
__global__ void __launch_bounds__(kMaxCanvas) canvas_step_kernel(CanvasStepParams p) {
  __shared__ float keys[kMaxCanvas];
  __shared__ int order[kMaxCanvas];
  __shared__ float entropy[kMaxCanvas];
  __shared__ unsigned char accept[kMaxCanvas];
  __shared__ int confident;
  __shared__ float mean;
  const int i = static_cast<int>(threadIdx.x);
  const bool live = i < p.length;
  const CanvasStepState before = *p.state;  // read by every thread before thread 0 rewrites it
  entropy[i] = live ? p.entropy[i] : 0.0f;
  keys[i] = live ? sort_key(entropy[i]) : INFINITY;
  order[i] = i;
  accept[i] = 0;
  block_sort_by_entropy<kMaxCanvas>(keys, order);

  // Acceptance and confidence: sequential double sums in one thread, exactly the CPU policies'
  // order, so that the accept decisions and the strict < compare replay bit for bit.
  if (i == 0) {
    double cum = 0.0;
    for (int k = 0; k < p.length; ++k) {
      const int pos = order[k];
      cum += entropy[pos];
      accept[pos] = math::entropy_bound_accepts(cum, entropy[pos], p.entropy_bound) ? 1 : 0;
    }
    double sum = 0.0;
    for (int k = 0; k < p.length; ++k) sum += entropy[k];
    mean = static_cast<float>(sum / p.length);
    confident = mean < p.confidence_threshold ? 1 : 0;
  }
  __syncthreads();
  if (live) {
    p.accepted[i] = accept[i];
    p.next_canvas[i] = accept[i] ? p.candidate[i] : renoise_token(p.key, static_cast<std::uint32_t>(i), p.vocab);
  }
  const int accepted = __syncthreads_count(live && accept[i]);

  // Stability: equal to each of the last `stability_threshold` argmax canvases (k means k + 1 in
  // a row); then this argmax canvas replaces the oldest entry of the ring.
  bool stable = true;
  if (p.stability_threshold > 0) {
    bool equal = true;
    if (live) {
      for (int h = 0; h < before.history_count; ++h) equal = equal && p.history[h * p.length + i] == p.argmax[i];
    }
    stable = __syncthreads_and(equal) && before.history_count == p.stability_threshold;
    if (live) p.history[before.history_head * p.length + i] = p.argmax[i];
  }
  if (i == 0) {
    CanvasStepState after = before;
    if (p.stability_threshold > 0) {
      after.history_head = (before.history_head + 1) % p.stability_threshold;
      after.history_count = before.history_count < p.stability_threshold ? before.history_count + 1
                                                                         : p.stability_threshold;
    }
    after.stable = stable ? 1 : 0;
    after.confident = confident;
    after.stop = stable && confident ? 1 : 0;
    after.accepted = accepted;
    after.mean_entropy = mean;
    *p.state = after;
  }
}

}  // namespace diffusion_gemma::cuda
