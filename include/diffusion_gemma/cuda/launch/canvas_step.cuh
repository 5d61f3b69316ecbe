// SPDX-License-Identifier: Apache-2.0
// Host launcher of the canvas step kernel (kernel/canvas_step.cuh). No workspace: the history
// ring and the state are the caller's device buffers.
#pragma once

#include <cuda_runtime_api.h>

#include <diffusion_gemma/core/status.hpp>
#include <diffusion_gemma/cuda/kernel/canvas_step.cuh>
#include <diffusion_gemma/cuda/runtime.hpp>

namespace diffusion_gemma::cuda {

inline std::size_t canvas_step_workspace_bytes() { return 0; }

inline Status launch_canvas_step(const CanvasStepParams& p, cudaStream_t stream) {
  if (p.length <= 0 || p.length > kMaxCanvas) {
    return make_status(StatusCode::kUnsupported, "canvas step: length ", p.length, " (the device step supports 1..",
                       kMaxCanvas, ")");
  }
  if (p.stability_threshold < 0) {
    return make_status(StatusCode::kInvalidArgument, "canvas step: stability threshold ", p.stability_threshold);
  }
  if (p.vocab == 0) return make_status(StatusCode::kInvalidArgument, "canvas step: empty vocabulary");
  canvas_step_kernel<0><<<1, kMaxCanvas, 0, stream>>>(p);
  DG_CUDA_TRY_LAUNCH("canvas_step_kernel");
  return {};
}

}  // namespace diffusion_gemma::cuda
