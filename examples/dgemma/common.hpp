// SPDX-License-Identifier: Apache-2.0
// Pieces shared by dgemma's subcommands: model loading with progress, sampler flags.
#pragma once

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include <dirent.h>
#include <sys/stat.h>
#include <unistd.h>

#include <diffusion_gemma/cpu/engine.hpp>
#include <diffusion_gemma/cpu/model.hpp>
#include <diffusion_gemma/io/chat_format.hpp>
#include <diffusion_gemma/io/tokenizer.hpp>
#include <diffusion_gemma/io/utf8.hpp>
#include <diffusion_gemma/runtime/decoder.hpp>

#include "cli.hpp"

namespace dgemma {

using diffusion_gemma::GenerationConfig;

// Text of ids; ids the tokenizer does not know (a model vocabulary larger than tokenizer.json's)
// show as <ID> instead of failing mid-generation.
inline std::string decode_known(const diffusion_gemma::io::Tokenizer& tok, const std::vector<std::int32_t>& ids,
                                bool skip_special_tokens = true) {
  std::string text;
  std::vector<int> run;
  for (auto id : ids) {
    if (tok.has_id(id)) {
      run.push_back(id);
      continue;
    }
    text += tok.decode(run, skip_special_tokens);
    run.clear();
    text += "<" + std::to_string(id) + ">";
  }
  return text + tok.decode(run, skip_special_tokens);
}

inline bool stderr_is_terminal() { return ::isatty(2) == 1; }

// A text input the user names on the command line, read to its end: "-" is standard input, a pipe
// or terminal (/dev/stdin, a shell's <(...)) is read as it comes, and anything else goes through
// io::read_text_file, which refuses directories and special files by name. A stream is capped so
// that /dev/zero or a runaway producer ends in an error rather than in the OOM killer.
inline std::string read_user_input(const std::string& path) {
  constexpr std::size_t kMaxStreamBytes = std::size_t{1} << 30;
  const auto read_stream = [&](std::istream& in, const std::string& name) {
    std::string text;
    char buf[1 << 16];
    while (in.read(buf, sizeof buf) || in.gcount() > 0) {
      text.append(buf, static_cast<std::size_t>(in.gcount()));
      if (text.size() > kMaxStreamBytes) {
        throw diffusion_gemma::Error(diffusion_gemma::StatusCode::kInvalidArgument,
                                     name + ": more than " + std::to_string(kMaxStreamBytes >> 20) + " MiB");
      }
    }
    if (in.bad()) throw diffusion_gemma::Error(diffusion_gemma::StatusCode::kIoError, name + ": read failed");
    return text;
  };
  if (path == "-") return read_stream(std::cin, "standard input");
  struct stat st {};
  if (::stat(path.c_str(), &st) == 0 && (S_ISFIFO(st.st_mode) || S_ISCHR(st.st_mode))) {
    std::ifstream in(path, std::ios::binary);
    if (!in) throw diffusion_gemma::Error(diffusion_gemma::StatusCode::kNotFound, path + ": cannot open");
    return read_stream(in, path);
  }
  return diffusion_gemma::io::read_text_file(path);
}

// read_user_input's text, refused (exit 1, naming the file) unless it is valid UTF-8: the tokenizer
// would encode U+FFFD in place of the bad bytes, ids that no prompt of the user's ever runs.
inline std::string read_utf8_input(const std::string& path) {
  std::string text = read_user_input(path);
  const auto bad = diffusion_gemma::io::find_invalid_utf8(text);
  if (bad != std::string::npos) {
    throw diffusion_gemma::Error(diffusion_gemma::StatusCode::kInvalidArgument,
                                 (path == "-" ? std::string("standard input") : path) + ": not valid UTF-8 (byte " +
                                     std::to_string(bad) + ")");
  }
  return text;
}

// Fails, naming `path`, when an output file could not be opened for writing; finds that out
// without creating or truncating anything, so that it can run before a long job whose later
// checks may still refuse it (and `path` may be the job's own input).
inline void require_writable(const std::string& path) {
  struct stat st {};
  const auto fail = [&](const std::string& why) {
    throw diffusion_gemma::Error(diffusion_gemma::StatusCode::kNotFound, path + ": cannot be written (" + why + ")");
  };
  if (::stat(path.c_str(), &st) == 0) {
    if (S_ISDIR(st.st_mode)) fail("it is a directory");
    if (::access(path.c_str(), W_OK) != 0) fail("no write permission");
    return;
  }
  const auto dir_of = [](const std::string& p) {
    const std::size_t slash = p.find_last_of('/');
    return slash == std::string::npos ? std::string(".") : slash == 0 ? std::string("/") : p.substr(0, slash);
  };
  // A dangling symbolic link is written through: the file is created where the link points, so
  // that is the directory to check (the link's own one is not).
  std::string target = path;
  for (int hops = 0;; ++hops) {
    if (::lstat(target.c_str(), &st) != 0 || !S_ISLNK(st.st_mode)) break;
    if (hops == 40) fail("too many levels of symbolic links");
    std::string link(static_cast<std::size_t>(st.st_size > 0 ? st.st_size : 4096) + 1, '\0');
    const ssize_t n = ::readlink(target.c_str(), &link[0], link.size());
    if (n < 0) fail(std::string("cannot read the symbolic link: ") + std::strerror(errno));
    link.resize(static_cast<std::size_t>(n));
    target = link.empty() || link[0] == '/' ? link : dir_of(target) + "/" + link;
  }
  const std::string dir = dir_of(target);
  const std::string named = target == path ? dir : dir + " (where the link points)";
  if (::stat(dir.c_str(), &st) != 0) fail(named + ": " + std::strerror(errno));
  if (!S_ISDIR(st.st_mode)) fail(named + " is not a directory");
  if (::access(dir.c_str(), W_OK | X_OK) != 0) fail("no write permission in " + named);
}

// Whether two paths name the same existing file (another spelling, a symbolic or a hard link).
inline bool same_file(const std::string& a, const std::string& b) {
  struct stat sa {}, sb {};
  return ::stat(a.c_str(), &sa) == 0 && ::stat(b.c_str(), &sb) == 0 && sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino;
}

// Refuses an output path that names a file of the checkpoint directory: the weights are
// memory-mapped, so truncating model.safetensors under the running model kills the process with
// SIGBUS and leaves the checkpoint empty (and no output belongs over config.json or tokenizer.json).
// Compares device and inode, so another spelling, a symlink or a hard link is caught too. Inputs
// read whole before the output opens (a batch's prompts) may be overwritten, as `sort -o` allows.
inline void refuse_overwriting_checkpoint(const std::string& flag, const std::string& path, const std::string& model_dir) {
  struct stat out {};
  if (::stat(path.c_str(), &out) != 0) return;  // a new file
  DIR* d = ::opendir(model_dir.c_str());
  if (d == nullptr) return;
  std::string hit;
  while (const dirent* e = ::readdir(d)) {
    const std::string name = e->d_name;
    const std::string file = model_dir + "/" + name;
    struct stat st {};
    if (name != "." && name != ".." && ::stat(file.c_str(), &st) == 0 && S_ISREG(st.st_mode) && same_file(file, path)) {
      hit = name;
      break;
    }
  }
  ::closedir(d);
  if (!hit.empty()) {
    throw diffusion_gemma::Error(diffusion_gemma::StatusCode::kInvalidArgument,
                                 "--" + flag + " " + path + " is the checkpoint's own " + model_dir + "/" + hit +
                                     ": refusing to overwrite it");
  }
}

// The checkpoint's tokenizer.json, or null when it has none (a model driven by token ids only).
inline std::unique_ptr<diffusion_gemma::io::Tokenizer> load_tokenizer_if_present(const std::string& dir) {
  const std::string path = dir + "/tokenizer.json";
  if (::access(path.c_str(), F_OK) != 0) return nullptr;
  return std::make_unique<diffusion_gemma::io::Tokenizer>(diffusion_gemma::io::Tokenizer::from_file(path));
}

// Prompt text -> ids as `dgemma generate` and `dgemma batch` tokenize it: a user turn of the chat
// format (with an optional system turn and thinking), or raw text that starts with <bos> whether or
// not tokenizer.json's post-processor adds it. `what` names the prompt in errors.
struct PromptFormat {
  bool chat = false;
  bool think = false;
  std::string system;  // empty: no system turn
  bool empty_thought_channel = false;  // io::chat_options_for(): as the checkpoint's chat template
};
inline std::vector<std::int32_t> encode_text_prompt(const diffusion_gemma::io::Tokenizer& tok,
                                                    const diffusion_gemma::ModelConfig& cfg, const std::string& text,
                                                    const PromptFormat& format, const std::string& what) {
  if (!diffusion_gemma::io::is_valid_utf8(text)) throw UsageError(what + " is not valid UTF-8");
  if (format.chat && !diffusion_gemma::io::is_valid_utf8(format.system)) throw UsageError("--system is not valid UTF-8");
  std::vector<int> ids;
  if (format.chat) {
    std::vector<diffusion_gemma::io::ChatMessage> msgs;
    if (!format.system.empty()) msgs.push_back({"system", format.system});
    msgs.push_back({"user", text});
    diffusion_gemma::io::ChatOptions co;
    co.enable_thinking = format.think;
    co.empty_thought_channel = format.empty_thought_channel;
    ids = diffusion_gemma::io::encode_chat(tok, msgs, co);
  } else {
    ids = tok.encode(text);
    if (ids.empty() || ids[0] != cfg.bos_token_id) ids.insert(ids.begin(), cfg.bos_token_id);
  }
  std::vector<std::int32_t> prompt;
  for (int id : ids) {
    if (id < 0 || id >= cfg.vocab_size) {
      throw diffusion_gemma::Error(diffusion_gemma::StatusCode::kInvalidArgument,
                                   tok.source() + " produced id " + std::to_string(id) +
                                       ", outside the model's vocabulary of " + std::to_string(cfg.vocab_size));
    }
    prompt.push_back(id);
  }
  return prompt;
}

// Loads a checkpoint; on a terminal, a progress line while the weights are read into memory.
inline std::shared_ptr<const diffusion_gemma::cpu::Model> load_model(const std::string& dir, bool check_weights) {
  if (::access(dir.c_str(), F_OK) != 0) {
    throw diffusion_gemma::Error(diffusion_gemma::StatusCode::kNotFound, dir + ": model directory does not exist");
  }
  diffusion_gemma::cpu::LoadProgress progress;
  if (stderr_is_terminal()) {
    progress = [](std::size_t done, std::size_t total) {
      std::fprintf(stderr, "\rloading weights %.0f/%.0f MiB", done / 1048576.0, total / 1048576.0);
      if (done == total) std::fprintf(stderr, "\r\033[K");
      std::fflush(stderr);
    };
  }
  return diffusion_gemma::cpu::Model::load(dir, progress, check_weights);
}

// Flags that choose how the CPU engine runs (threads, precision).
inline std::vector<FlagSpec> engine_flag_specs(const char* default_precision) {
  return {
      {"threads", "N", "CPU threads (default: all)"},
      {"precision", "P", std::string("exact (fp32 activations) or fast (bf16 products on AMX tiles or AVX512-BF16 "
                                     "dot products, int8 activations for 4-bit weights, where the CPU has them); "
                                     "default ") + default_precision},
  };
}

// EngineOptions from those flags; the kernel family comes from the CPU (or DG_CPU_ISA).
inline diffusion_gemma::cpu::EngineOptions engine_options(const Flags& f, diffusion_gemma::cpu::Precision fallback) {
  diffusion_gemma::cpu::EngineOptions eo;
  eo.threads = static_cast<int>(f.integer("threads", 0, 0, diffusion_gemma::cpu::kMaxThreads));
  eo.precision = fallback;
  if (f.has("precision") && !diffusion_gemma::cpu::parse_precision(f.str("precision"), &eo.precision)) {
    throw UsageError("--precision must be exact or fast (got '" + f.str("precision") + "')");
  }
  return eo;
}

inline std::vector<FlagSpec> sampler_flag_specs() {
  return {
      {"max-new-tokens", "N", "tokens to generate (rounded up to whole canvases); default: generation_config.json"},
      {"max-denoising-steps", "N", "denoising steps per canvas at most"},
      {"t-min", "T", "temperature at the last step"},
      {"t-max", "T", "temperature at the first step"},
      {"entropy-bound", "G", "entropy bound of the acceptance rule (nats)"},
      {"stability-threshold", "K", "stop when the argmax canvas equals each of the previous K"},
      {"confidence-threshold", "H", "... and the mean entropy is below H (nats)"},
      {"stop-ids", "IDS", "comma-separated stop token ids; default: eos_token_id of generation_config.json"},
  };
}

// Applies sampler/scheduler flags over the checkpoint defaults; range errors name the flag.
template <class Options>
void apply_sampler_flags(const Flags& f, std::int64_t vocab, Options& o) {
  o.scheduler.max_new_tokens =
      static_cast<int>(f.integer("max-new-tokens", o.scheduler.max_new_tokens, 1, 1 << 24));
  o.sampler.max_denoising_steps =
      static_cast<int>(f.integer("max-denoising-steps", o.sampler.max_denoising_steps, 1, GenerationConfig::kMaxDenoisingSteps));
  o.sampler.schedule.t_min = f.number("t-min", o.sampler.schedule.t_min, 0.0, 1e6);
  o.sampler.schedule.t_max = f.number("t-max", o.sampler.schedule.t_max, 0.0, 1e6);
  if (!(o.sampler.schedule.t_max > o.sampler.schedule.t_min)) {
    throw UsageError("--t-max must be greater than --t-min (got t_min " + std::to_string(o.sampler.schedule.t_min) +
                     ", t_max " + std::to_string(o.sampler.schedule.t_max) + ")");
  }
  o.sampler.acceptance.entropy_bound = f.number("entropy-bound", o.sampler.acceptance.entropy_bound, 0.0, 1e9);
  if (!(o.sampler.acceptance.entropy_bound > 0.0)) throw UsageError("--entropy-bound must be > 0");
  o.sampler.stopping.stability_threshold =
      static_cast<int>(f.integer("stability-threshold", o.sampler.stopping.stability_threshold, 0, 1 << 20));
  o.sampler.stopping.confidence_threshold =
      f.number("confidence-threshold", o.sampler.stopping.confidence_threshold, 0.0, 1e9);
  if (!(o.sampler.stopping.confidence_threshold > 0.0)) throw UsageError("--confidence-threshold must be > 0");
  if (f.has("stop-ids")) {
    o.scheduler.stop_token_ids.clear();
    // Any non-negative id is accepted, as transformers does: one outside the vocabulary never matches.
    (void)vocab;
    for (auto id : f.integers("stop-ids", 0, INT32_MAX)) o.scheduler.stop_token_ids.push_back(static_cast<int>(id));
  }
}

}  // namespace dgemma
