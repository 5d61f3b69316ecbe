// SPDX-License-Identifier: Apache-2.0
#pragma once

#define DG_VERSION_MAJOR 0
#define DG_VERSION_MINOR 1
#define DG_VERSION_PATCH 0

namespace diffusion_gemma {
inline constexpr const char* kVersionString = "0.1.0";
}  // namespace diffusion_gemma
