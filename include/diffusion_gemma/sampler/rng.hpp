// SPDX-License-Identifier: Apache-2.0
// Randomness policies of a Sampler. PhiloxRng draws every random token from the counter-based
// generator keyed by (seed, canvas, step, position, purpose); ReplayRng plays back the draws that
// transformers made (canvas init, multinomial samples, renoise tokens) for parity tests.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include <diffusion_gemma/core/rng.hpp>
#include <diffusion_gemma/core/status.hpp>

namespace diffusion_gemma {

struct PhiloxRng {
  struct Arguments {
    std::uint64_t seed = 0;
  };
  static constexpr bool kReplaysSamples = false;

  explicit PhiloxRng(const Arguments& a) : seed_(a.seed) {}

  DrawKey key(int canvas, int step) const {
    return DrawKey{seed_, static_cast<std::uint32_t>(canvas), static_cast<std::uint32_t>(step)};
  }
  // A uniform token in [0, vocab) for canvas init (kInit, step 0) or renoising (kRenoise).
  std::int32_t token(DrawPurpose purpose, int canvas, int step, int position, std::int64_t vocab) const {
    const Philox4x32 d = draw(key(canvas, step), purpose, static_cast<std::uint32_t>(position), 0);
    return static_cast<std::int32_t>(uniform_below(d.v[0], static_cast<std::uint32_t>(vocab)));
  }

 private:
  std::uint64_t seed_;
};

// Recorded draws, as `dgemma replay` reads them from a draws file (I64 tensors
// canvas.{b}.init, canvas.{b}.step.{s}.sample, canvas.{b}.step.{s}.renoise).
struct RecordedDraws {
  std::string source;  // for messages
  std::map<std::string, std::vector<std::int32_t>> tensors;

  const std::vector<std::int32_t>& at(const std::string& name, int canvas, int step) const {
    const auto it = tensors.find(name);
    if (it == tensors.end()) {
      throw_error(StatusCode::kOutOfRange, source, ": ran out of recorded draws at canvas ", canvas, ", step ", step,
                  " (no tensor '", name, "')");
    }
    {
      const std::lock_guard<std::mutex> lock(mutex_);  // draws may be read from several threads
      used_.insert(it->first);
    }
    return it->second;
  }
  bool was_used(const std::string& name) const {
    const std::lock_guard<std::mutex> lock(mutex_);
    return used_.count(name) != 0;
  }
  // The recorded tensors no draw has read, in name order. After a replay, any left over mean the
  // recording went further than the replay did (another model, prompt or sampler settings), which
  // a replay that merely ran out of draws would not notice.
  std::vector<std::string> unused() const {
    const std::lock_guard<std::mutex> lock(mutex_);
    std::vector<std::string> out;
    for (const auto& [name, values] : tensors) {
      if (used_.count(name) == 0) out.push_back(name);
    }
    return out;
  }

 private:
  mutable std::mutex mutex_;
  mutable std::set<std::string> used_;
};

class ReplayRng {
 public:
  struct Arguments {
    std::shared_ptr<const RecordedDraws> draws;
  };
  static constexpr bool kReplaysSamples = true;

  explicit ReplayRng(const Arguments& a) : draws_(a.draws) {
    if (!draws_) throw_error(StatusCode::kInvalidArgument, "ReplayRng needs recorded draws");
  }

  DrawKey key(int canvas, int step) const {
    return DrawKey{0, static_cast<std::uint32_t>(canvas), static_cast<std::uint32_t>(step)};
  }
  std::int32_t token(DrawPurpose purpose, int canvas, int step, int position, std::int64_t vocab) const {
    const std::string name = purpose == DrawPurpose::kInit
                                 ? "canvas." + std::to_string(canvas) + ".init"
                                 : "canvas." + std::to_string(canvas) + ".step." + std::to_string(step) + ".renoise";
    return checked(draws_->at(name, canvas, step), name, canvas, step, position, vocab);
  }
  // The candidate transformers sampled at (canvas, step, position).
  std::int32_t sample(int canvas, int step, int position, std::int64_t vocab) const {
    const std::string name = "canvas." + std::to_string(canvas) + ".step." + std::to_string(step) + ".sample";
    return checked(draws_->at(name, canvas, step), name, canvas, step, position, vocab);
  }

 private:
  std::int32_t checked(const std::vector<std::int32_t>& v, const std::string& name, int canvas, int step, int position,
                       std::int64_t vocab) const {
    if (position < 0 || static_cast<std::size_t>(position) >= v.size()) {
      throw_error(StatusCode::kOutOfRange, draws_->source, ": '", name, "' has ", v.size(), " draws; canvas ", canvas,
                  " step ", step, " needs position ", position);
    }
    const std::int32_t t = v[static_cast<std::size_t>(position)];
    if (t < 0 || t >= vocab) {
      throw_error(StatusCode::kFormatError, draws_->source, ": '", name, "'[", position, "] = ", t,
                  " is outside the vocabulary [0, ", vocab, ")");
    }
    return t;
  }
  std::shared_ptr<const RecordedDraws> draws_;
};

}  // namespace diffusion_gemma
