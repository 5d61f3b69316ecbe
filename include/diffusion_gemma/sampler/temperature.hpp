// SPDX-License-Identifier: Apache-2.0
// Temperature schedules. The reference anneals linearly from t_max (first step) to just above
// t_min (step N), anchored to N even when the loop stops early; the exponent form is JAX's
// AnnealingTemperatureShaper, identical at exponent 1.
#pragma once

#include <cmath>

#include <diffusion_gemma/core/math.hpp>
#include <diffusion_gemma/core/status.hpp>

namespace diffusion_gemma {

struct LinearTemperature {
  struct Arguments {
    double t_min = 0.4;
    double t_max = 0.8;
    double exponent = 1.0;
  };
  static Status can_implement(const Arguments& a) {
    if (!(a.t_min >= 0.0)) return make_status(StatusCode::kInvalidArgument, "t_min must be >= 0 (got ", a.t_min, ")");
    if (!(a.t_max > a.t_min)) {
      return make_status(StatusCode::kInvalidArgument, "t_max must be > t_min (got t_min ", a.t_min, ", t_max ", a.t_max, ")");
    }
    if (!(a.exponent > 0.0)) return make_status(StatusCode::kInvalidArgument, "temperature exponent must be > 0");
    return {};
  }
  // Temperature when `steps_remaining` = n of `max_steps` = N remain (n = N..1).
  static float temperature(const Arguments& a, int steps_remaining, int max_steps) {
    const float t_min = static_cast<float>(a.t_min);
    const float span = static_cast<float>(a.t_max - a.t_min);
    if (a.exponent == 1.0) return math::linear_temperature(t_min, span, steps_remaining, max_steps);
    const double noise = static_cast<double>(steps_remaining) / max_steps;
    return static_cast<float>(a.t_min + (a.t_max - a.t_min) * (1.0 - std::pow(1.0 - noise, a.exponent)));
  }
};

}  // namespace diffusion_gemma
