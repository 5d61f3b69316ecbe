// SPDX-License-Identifier: Apache-2.0
// The structured trace of a generation as JSON lines: one {"type": "step", ...} object per
// denoising step and one {"type": "canvas", ...} object per canvas of the result (committed, or
// cancelled while denoising), then a summary. docs/getting-started.md lists the fields.
#pragma once

#include <cstddef>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <string>

#include <nlohmann/json.hpp>

#include <diffusion_gemma/core/status.hpp>
#include <diffusion_gemma/runtime/trace.hpp>

namespace diffusion_gemma::io {

inline nlohmann::ordered_json to_json(const StepRecord& s) {
  return {{"type", "step"},           {"canvas", s.canvas},
          {"step", s.step},           {"steps_remaining", s.steps_remaining},
          {"temperature", s.temperature}, {"accepted", s.accepted},
          {"mean_entropy", s.mean_entropy}, {"max_entropy", s.max_entropy},
          {"draft_changes", s.draft_changes}, {"stable", s.stable},
          {"confident", s.confident}, {"seconds", s.seconds}};
}

inline nlohmann::ordered_json to_json(const CanvasRecord& c) {
  return {{"type", "canvas"},   {"canvas", c.canvas},     {"position", c.position},
          {"length", c.length}, {"steps", c.steps},       {"stop", to_string(c.stop)},
          {"valid_tokens", c.valid_tokens}, {"stop_token", c.stop_token}, {"seconds", c.seconds}};
}

inline nlohmann::ordered_json summary_json(const GenerationResult& r) {
  return {{"type", "summary"},
          {"finish", to_string(r.finish)},
          {"tokens", r.tokens.size()},  // whole canvases, PAD included (transformers' sequences)
          {"text_tokens", r.text_tokens().size()},
          {"canvases", r.canvases.size()},
          {"forwards", r.forwards},
          {"tokens_per_forward", r.tokens_per_forward},
          {"seconds", r.seconds},
          {"prefill_seconds", r.prefill_seconds},
          {"first_commit_seconds", r.first_commit_seconds}};
}

// Appends JSON lines to a file as records arrive, so a long run can be followed with tail -f.
class TraceWriter {
 public:
  explicit TraceWriter(const std::string& path) : path_(path), f_(std::fopen(path.c_str(), "w")) {
    if (f_ == nullptr) throw_error(StatusCode::kIoError, path, ": cannot open for writing (", std::strerror(errno), ")");
  }
  ~TraceWriter() {
    if (f_ != nullptr) std::fclose(f_);
  }
  TraceWriter(const TraceWriter&) = delete;
  TraceWriter& operator=(const TraceWriter&) = delete;

  void write(const StepRecord& r) { write_line(to_json(r).dump()); }
  void write(const CanvasRecord& r) {
    write_line(to_json(r).dump());
    ++canvases_written_;
  }
  // A canvas cancelled while denoising reaches no on_commit callback: it is written here, before
  // the summary, so the trace holds every canvas the summary counts.
  void write_summary(const GenerationResult& r) {
    for (std::size_t i = canvases_written_; i < r.canvases.size(); ++i) write(r.canvases[i]);
    write_line(summary_json(r).dump());
  }
  // Closes the file, reporting what the last writes left unsaid (the destructor cannot).
  void close() {
    if (f_ == nullptr) return;
    const bool ok = std::fclose(f_) == 0;
    f_ = nullptr;
    if (!ok) throw_error(StatusCode::kIoError, path_, ": write failed (", std::strerror(errno), ")");
  }

 private:
  // Flushed line by line, so that a full disk is reported at the line it cut, not lost in stdio's buffer.
  void write_line(const std::string& line) {
    if (f_ == nullptr) throw_error(StatusCode::kIoError, path_, ": written after close()");
    if (std::fputs(line.c_str(), f_) < 0 || std::fputc('\n', f_) == EOF || std::fflush(f_) != 0 || std::ferror(f_)) {
      throw_error(StatusCode::kIoError, path_, ": write failed (", std::strerror(errno), ")");
    }
  }
  std::string path_;
  std::FILE* f_;
  std::size_t canvases_written_ = 0;
};

}  // namespace diffusion_gemma::io
