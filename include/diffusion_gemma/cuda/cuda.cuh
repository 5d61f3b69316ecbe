// SPDX-License-Identifier: Apache-2.0
// The CUDA back-end in one include, for .cu translation units compiled by nvcc:
//
//   #include <diffusion_gemma/cuda/cuda.cuh>
//   auto model = diffusion_gemma::cuda::Model::create(config, weights);          // BF16 by default
//   diffusion_gemma::Decoder<diffusion_gemma::cuda::Engine<diffusion_gemma::DiffusionGemmaBackbone>> decoder(model);
//
// Layers (docs/design.md, Layout): device/ inline device functions, kernel/ thin __global__ templates,
// launch/ host launchers (caller's stream and workspace, no allocation, no synchronisation),
// runtime.hpp host RAII, model.hpp / kv_cache.hpp / engine.cuh the back-end's objects.
#pragma once

#include <diffusion_gemma/cuda/runtime.hpp>
#include <diffusion_gemma/cuda/workspace.hpp>

#include <diffusion_gemma/cuda/device/convert.cuh>
#include <diffusion_gemma/cuda/device/reduce.cuh>
#include <diffusion_gemma/cuda/device/router.cuh>
#include <diffusion_gemma/cuda/device/sampling.cuh>
#include <diffusion_gemma/cuda/device/sort.cuh>

#include <diffusion_gemma/cuda/kernel/attention.cuh>
#include <diffusion_gemma/cuda/kernel/canvas_step.cuh>
#include <diffusion_gemma/cuda/kernel/grouped_gemm.cuh>
#include <diffusion_gemma/cuda/kernel/moe.cuh>
#include <diffusion_gemma/cuda/kernel/norm.cuh>
#include <diffusion_gemma/cuda/kernel/rope.cuh>
#include <diffusion_gemma/cuda/kernel/vocab_pass.cuh>

#include <diffusion_gemma/cuda/launch/attention.cuh>
#include <diffusion_gemma/cuda/launch/canvas_step.cuh>
#include <diffusion_gemma/cuda/launch/gemm.hpp>
#include <diffusion_gemma/cuda/launch/grouped_gemm.cuh>
#include <diffusion_gemma/cuda/launch/moe.cuh>
#include <diffusion_gemma/cuda/launch/norm.cuh>
#include <diffusion_gemma/cuda/launch/rope.cuh>
#include <diffusion_gemma/cuda/launch/vocab_pass.cuh>

#include <diffusion_gemma/cuda/engine.cuh>
#include <diffusion_gemma/cuda/engine_buffers.cuh>
#include <diffusion_gemma/cuda/kv_cache.hpp>
#include <diffusion_gemma/cuda/model.hpp>
