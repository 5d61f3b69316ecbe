// SPDX-License-Identifier: Apache-2.0
// `dgemma batch`: many prompts from a JSON Lines file, run together through the continuous batcher
// (runtime/batcher.hpp), one JSON line per prompt out, in input order. Each answer is the one
// `dgemma generate` gives for that prompt and seed: a sequence's tokens do not depend on its
// neighbours in a batch.
#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include <sys/stat.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include <diffusion_gemma/cpu/engine.hpp>
#include <diffusion_gemma/io/json_file.hpp>
#include <diffusion_gemma/runtime/batcher.hpp>

#include "commands.hpp"
#include "common.hpp"
#include "interrupt.hpp"

namespace dgemma {

namespace dg = diffusion_gemma;

namespace {

using Engine = dg::cpu::Engine<dg::DiffusionGemmaBackbone>;
using Batcher = dg::ContinuousBatcher<Engine>;
using Options = Batcher::Options;

struct Item {
  std::string where;  // FILE:LINE, for messages
  std::size_t line = 0;  // LINE of `where`, 1-based: "line" of the result
  std::vector<std::int32_t> prompt;
  Options options;
  nlohmann::ordered_json result;
  bool done = false;
};

// The parser's reason without what would mislead or garble a terminal: it counts lines within the
// one line it was given, and "last read" quotes the input's bytes, invalid UTF-8 included.
std::string parse_reason(const nlohmann::json::parse_error& e) {
  std::string why = e.what();
  const std::size_t colon = why.find(": ");
  why = colon == std::string::npos ? "parse error" : why.substr(colon + 2);
  const std::size_t last = why.find("; last read");
  if (last != std::string::npos) why.erase(last);
  for (char& c : why) {
    if (static_cast<unsigned char>(c) < 0x20 || static_cast<unsigned char>(c) >= 0x7f) c = '?';
  }
  return "column " + std::to_string(e.byte) + ": " + why;
}

// Writes `lines` to `path` (truncating it: its owner, mode and links stay), or throws naming it.
void write_lines(const std::string& path, const std::vector<std::string>& lines) {
  std::ofstream file(path, std::ios::binary | std::ios::trunc);
  if (!file) {
    throw dg::Error(dg::StatusCode::kIoError, path + ": cannot open for writing (" + std::strerror(errno) + ")");
  }
  for (const auto& l : lines) file << l << '\n';
  file.close();
  if (!file) throw dg::Error(dg::StatusCode::kIoError, path + ": write failed (" + std::strerror(errno) + ")");
}

// One input line: a JSON string (the prompt text) or an object with "prompt" (text) or
// "prompt_ids", and optionally "seed" and "max_new_tokens" over the flags' values. --chat formats
// text prompts only: ids are used exactly as given.
Item parse_line(const std::string& line, const std::string& where, const dg::io::Tokenizer* tok, const dg::ModelConfig& cfg,
                const PromptFormat& format, const Options& defaults) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(line);
  } catch (const nlohmann::json::parse_error& e) {
    throw UsageError(where + ": not a JSON value (" + parse_reason(e) + ")");
  }
  Item it;
  it.where = where;
  it.options = defaults;
  const auto text = [&](const std::string& t) {
    if (!tok) throw UsageError(where + ": a text prompt needs tokenizer.json in the model directory (or give prompt_ids)");
    if (t.empty()) throw UsageError(where + ": the prompt is empty");
    it.prompt = encode_text_prompt(*tok, cfg, t, format, where + ": the prompt");
  };
  if (j.is_string()) {
    text(j.get<std::string>());
    return it;
  }
  if (!j.is_object()) throw UsageError(where + ": expected a string or an object, got " + std::string(j.type_name()));
  for (auto f = j.begin(); f != j.end(); ++f) {
    const std::string& k = f.key();
    const auto& v = f.value();
    if (k == "prompt") {
      if (!v.is_string()) throw UsageError(where + ": \"prompt\" must be a string");
      if (j.contains("prompt_ids")) throw UsageError(where + ": give \"prompt\" or \"prompt_ids\", not both");
      text(v.get<std::string>());
    } else if (k == "prompt_ids") {
      if (!v.is_array() || v.empty()) throw UsageError(where + ": \"prompt_ids\" must be a non-empty array of token ids");
      for (const auto& id : v) {
        if (!id.is_number_integer() || id.get<std::int64_t>() < 0 || id.get<std::int64_t>() >= cfg.vocab_size) {
          throw UsageError(where + ": \"prompt_ids\" holds " + id.dump() + ", not a token id in [0, " +
                           std::to_string(cfg.vocab_size) + ")");
        }
        it.prompt.push_back(static_cast<std::int32_t>(id.get<std::int64_t>()));
      }
    } else if (k == "seed") {
      if (!v.is_number_unsigned()) throw UsageError(where + ": \"seed\" must be an integer in [0, 2^64)");
      it.options.sampler.rng.seed = v.get<std::uint64_t>();
    } else if (k == "max_new_tokens") {
      if (!v.is_number_integer() || v.get<std::int64_t>() < 1 || v.get<std::int64_t>() > (1 << 24)) {
        throw UsageError(where + ": \"max_new_tokens\" must be an integer in [1, 16777216]");
      }
      it.options.scheduler.max_new_tokens = static_cast<int>(v.get<std::int64_t>());
    } else {
      throw UsageError(where + ": unknown field \"" + k + "\" (known: prompt, prompt_ids, seed, max_new_tokens)");
    }
  }
  if (it.prompt.empty()) throw UsageError(where + ": needs \"prompt\" or \"prompt_ids\"");
  return it;
}

}  // namespace

int cmd_batch(const std::vector<std::string>& args) {
  auto specs = sampler_flag_specs();
  const std::vector<FlagSpec> own = {
      {"model", "DIR", "checkpoint directory (default: the bundled model, models/dg-tiny-tasks)"},
      {"input", "FILE", "JSON Lines (- for standard input): each line a prompt string, or {\"prompt\" | \"prompt_ids\", \"seed\", \"max_new_tokens\"}"},
      {"output", "FILE", "write the results here (default, or -: standard output)"},
      {"max-batch", "N", "sequences denoised together (default 16)"},
      {"chat", "", "wrap each text prompt as a user turn of the Gemma 4 chat format (prompt_ids stay as given)"},
      {"system", "TEXT", "system turn (with --chat)"},
      {"think", "", "thinking on (with --chat)"},
      {"seed", "N", "seed of every line that gives none, in [0, 2^64) (default 0)"},
      {"memory-budget", "MIB", "KV caches and workspace of the running sequences, at most this many MiB"},
      {"check-weights", "", "scan every weight for NaN/Inf at load"},
  };
  specs.insert(specs.begin(), own.begin(), own.end());
  for (auto& spec : engine_flag_specs(dg::cpu::precision_name(dg::cpu::EngineOptions{}.precision))) specs.push_back(spec);
  Flags f("batch",
          "Generates for every prompt of a JSON Lines file, many sequences per forward pass. Writes one JSON\n"
          "line per prompt, in input order: index, line (of --input, 1-based), text, tokens, seed, steps\n"
          "and stop reason per canvas (or index, line and error). Each answer equals `dgemma generate` with\n"
          "the same prompt, seed and flags.",
          specs);
  if (!f.parse(args)) {
    std::cout << f.usage();
    return 0;
  }
  if (!f.has("input")) throw UsageError("--input FILE is required");
  if ((f.has("system") || f.flag("think")) && !f.flag("chat")) throw UsageError("--system and --think need --chat");
  const std::string dir = f.str("model", DG_DEFAULT_MODEL_DIR);
  const int max_batch = static_cast<int>(f.integer("max-batch", 16, 1, 1024));
  const std::string text = read_user_input(f.str("input"));  // names the file when it is missing or not a file
  const std::string input = f.str("input") == "-" ? "standard input" : f.str("input");  // as errors name it
  // "-" is standard output, as the default is.
  const bool to_file = f.has("output") && f.str("output") != "-";
  if (f.has("output") && f.str("output").empty()) throw UsageError("--output needs a file name (or - for standard output)");
  // Flags that need no model are checked before the (possibly long) load.
  const dg::cpu::EngineOptions engine_opts = engine_options(f, dg::cpu::EngineOptions{}.precision);
  const std::size_t budget_bytes = static_cast<std::size_t>(f.integer("memory-budget", 0, 0, 1 << 30)) << 20;
  const std::uint64_t seed = f.unsigned_integer("seed", 0);
  if (to_file) refuse_overwriting_checkpoint("output", f.str("output"), dir);
  auto model = load_model(dir, f.flag("check-weights"));
  const auto& cfg = model->config();
  if (!cfg.is_diffusion()) throw UsageError(dir + " is not a DiffusionGemma checkpoint (model_type diffusion_gemma)");
  const std::unique_ptr<dg::io::Tokenizer> tok = load_tokenizer_if_present(dir);
  // From here a signal cancels the run (at its first step) instead of ending the program: the
  // load above is left to the default action, which stops it at once.
  InterruptGuard interrupts;

  Options defaults = dg::default_decode_options<Batcher::Sampler, Batcher::Scheduler>(model->generation_config());
  apply_sampler_flags(f, cfg.vocab_size, defaults);
  defaults.sampler.rng.seed = seed;
  PromptFormat format;
  format.chat = f.flag("chat");
  format.think = f.flag("think");
  format.system = f.str("system", "");
  if (format.chat) format.empty_thought_channel = dg::io::chat_options_for(dir).empty_thought_channel;

  // Every line is read and checked before any work, so that line 900 cannot fail after an hour.
  std::vector<Item> items;
  std::size_t line_no = 0, pos = 0;
  while (pos < text.size()) {
    std::size_t end = text.find('\n', pos);
    if (end == std::string::npos) end = text.size();
    std::string line = text.substr(pos, end - pos);
    pos = end + 1;
    ++line_no;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.find_first_not_of(" \t") == std::string::npos) continue;
    items.push_back(parse_line(line, input + ":" + std::to_string(line_no), tok.get(), cfg, format, defaults));
    items.back().line = line_no;
  }
  if (items.empty()) throw UsageError(input + ": no prompts (one JSON value per line)");
  if (to_file) require_writable(f.str("output"));  // now, not after the last prompt
  Engine engine(model, engine_opts);
  Batcher::Limits limits;
  limits.max_batch = max_batch;
  limits.max_queue = items.size();
  limits.memory_budget_bytes = budget_bytes;
  Batcher batcher(engine, limits);
  std::size_t finished = 0, failed = 0;
  std::int64_t tokens = 0;
  std::vector<Batcher::RequestId> ids(items.size());
  for (std::size_t i = 0; i < items.size(); ++i) {
    Batcher::Request r;
    r.prompt = items[i].prompt;
    r.options = items[i].options;
    r.on_done = [&, i](const dg::GenerationResult& g, const dg::Status& s) {
      Item& it = items[i];
      it.done = true;
      ++finished;
      auto& j = it.result;
      j["index"] = i;
      j["line"] = it.line;
      if (!s.ok()) {
        j["error"] = s.code() == dg::StatusCode::kCancelled ? std::string("cancelled") : s.message();
        if (s.code() != dg::StatusCode::kCancelled) ++failed;
        return;
      }
      const auto out = g.text_tokens();
      tokens += static_cast<std::int64_t>(out.size());
      std::vector<int> steps;
      std::vector<std::string> stops;
      for (const auto& c : g.canvases) {
        steps.push_back(c.steps);
        stops.push_back(dg::to_string(c.stop));
      }
      j["text"] = tok ? decode_known(*tok, out) : std::string();
      j["tokens"] = out;
      j["seed"] = it.options.sampler.rng.seed;
      j["prompt_tokens"] = it.prompt.size();
      j["steps"] = steps;
      j["stop"] = stops;
      j["finish"] = dg::to_string(g.finish);
    };
    try {
      ids[i] = batcher.submit(std::move(r));  // checks positions and the memory budget: a line that can never run fails here
    } catch (const dg::Error& e) {
      throw dg::Error(e.code(), items[i].where + ": " + e.what());
    }
  }
  // Standard output gets each result as soon as every earlier line has its own, in input order,
  // so that a reader downstream sees the answers as they come. --output FILE is written once at
  // the end, as `sort -o` writes: FILE may be the input, and an interrupted run leaves it alone.
  const auto t0 = std::chrono::steady_clock::now();
  // Progress: a line redrawn in place on a terminal; in a log, a line every 10 seconds.
  const bool progress = stderr_is_terminal();
  bool progress_drawn = false;
  std::size_t reported = 0, written = 0;
  double logged = 0;
  const auto line_of = [&](std::size_t i) {
    const nlohmann::ordered_json& j =
        items[i].done ? items[i].result : nlohmann::ordered_json{{"index", i}, {"line", items[i].line}, {"error", "not run"}};
    return j.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace);
  };
  // std::cout's flush does not report a failed write (a full disk): stdio's error flag does.
  const auto stdout_failed = [] { return !std::cout || std::fflush(stdout) != 0 || std::ferror(stdout); };
  const auto write_ready = [&](bool all) {
    if (to_file || written == items.size() || !(all || items[written].done)) return;
    if (progress_drawn) {  // the results share the terminal with the progress line
      std::fputs("\r\033[K", stderr);
      progress_drawn = false;
      reported = SIZE_MAX;
    }
    for (; written < items.size() && (all || items[written].done); ++written) std::cout << line_of(written) << "\n";
    std::cout.flush();
    if (stdout_failed()) {
      throw dg::Error(dg::StatusCode::kIoError, std::string("standard output: write failed (") + std::strerror(errno) + ")");
    }
  };
  bool cancelling = false;
  const auto cancel_on_signal = [&] {
    if (cancelling || !InterruptGuard::interrupted()) return;
    // The first signal cancels what has not finished; those lines get "error": "cancelled". The
    // previous handlers come back, so that a second signal ends the program (one sent twice at
    // once, as `timeout` sends it to the process and its group, counts once).
    cancelling = true;
    interrupts.disarm();
    for (std::size_t i = 0; i < items.size(); ++i) {
      if (!items[i].done) batcher.cancel(ids[i]);
    }
  };
  cancel_on_signal();
  while (batcher.step()) {
    cancel_on_signal();
    write_ready(false);
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (progress ? finished != reported : s - logged >= 10.0) {
      reported = finished;
      logged = s;
      std::fprintf(stderr, progress ? "\r%zu/%zu prompts, %.1f tokens/s" : "%zu/%zu prompts, %.1f tokens/s\n", finished,
                   items.size(), s > 0 ? tokens / s : 0.0);
      std::fflush(stderr);
      progress_drawn = progress;
    }
  }
  // Opening the output may block (a FIFO without a reader): signals end the program again from here.
  interrupts.disarm();
  write_ready(true);  // a line for every prompt ("not run" if the batcher stopped early)
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const auto st = batcher.stats();
  std::fprintf(stderr, "%s[%zu prompts, %lld tokens in %.2f s, %.1f tokens/s, %.1f sequences per denoising pass]\n",
               progress_drawn ? "\r\033[K" : "", items.size(), static_cast<long long>(tokens), seconds,
               seconds > 0 ? tokens / seconds : 0.0,
               st.denoise_passes ? static_cast<double>(st.denoise_steps) / static_cast<double>(st.denoise_passes) : 0.0);
  // Interrupted only if a prompt was: a signal during the last step leaves a complete run.
  const std::size_t cancelled = static_cast<std::size_t>(std::count_if(
      items.begin(), items.end(), [](const Item& it) { return it.done && it.result.value("error", "") == "cancelled"; }));
  if (to_file) {
    std::vector<std::string> lines;
    for (std::size_t i = 0; i < items.size(); ++i) lines.push_back(line_of(i));
    const std::string output = f.str("output");
    if (f.str("input") == "-" || !same_file(output, f.str("input"))) {
      write_lines(output, lines);
      if (cancelled > 0) {
        std::fprintf(stderr, "dgemma batch: interrupted: %zu of %zu prompts cancelled; the results are in %s\n", cancelled,
                     items.size(), output.c_str());
        return 130;
      }
    } else {
      // --output is the input. The results are first written whole beside it, so that neither
      // an interruption nor a write cut short (a full disk, a signal) loses both: an interrupted
      // run leaves the input as it was, a complete one copies the results over it.
      std::string partial = output + ".partial-XXXXXX";
      const int fd = ::mkstemp(&partial[0]);
      if (fd >= 0) {
        ::close(fd);
        try {
          write_lines(partial, lines);
        } catch (const dg::Error& e) {
          std::remove(partial.c_str());
          throw dg::Error(e.code(), std::string(e.what()) + "; --output (the input) was left as it was");
        }
      } else if (cancelled > 0) {
        // No room beside it (a read-only directory): the results go to standard output.
        std::fprintf(stderr, "dgemma batch: %s: cannot create (%s); the results follow on standard output\n",
                     partial.c_str(), std::strerror(errno));
        for (const auto& l : lines) std::cout << l << "\n";
        std::cout.flush();
        partial = "standard output";
      } else {
        partial.clear();
      }
      if (cancelled > 0) {
        std::fprintf(stderr,
                     "dgemma batch: interrupted: %zu of %zu prompts cancelled; the results are in %s "
                     "(--output is the input: left as it was)\n",
                     cancelled, items.size(), partial.c_str());
        return 130;
      }
      try {
        write_lines(output, lines);
      } catch (const dg::Error& e) {
        if (partial.empty()) throw;
        throw dg::Error(e.code(), std::string(e.what()) + "; the input is cut, the results are whole in " + partial);
      }
      if (!partial.empty()) std::remove(partial.c_str());
    }
  } else if (cancelled > 0) {
    std::fprintf(stderr, "dgemma batch: interrupted: %zu of %zu prompts cancelled\n", cancelled, items.size());
    return 130;
  }
  if (failed > 0) {
    // The first failure in input order, and how many there were.
    for (const auto& it : items) {
      if (it.result.contains("error")) {
        std::fprintf(stderr, "dgemma batch: error: %zu of %zu prompts failed; the first, %s: %s\n", failed, items.size(),
                     it.where.c_str(), it.result["error"].get<std::string>().c_str());
        break;
      }
    }
    return 1;
  }
  return 0;
}

}  // namespace dgemma
