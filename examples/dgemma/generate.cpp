// SPDX-License-Identifier: Apache-2.0
// dgemma generate: text or ids in, text out, with a live view of the canvas as it denoises.
#include <atomic>
#include <csignal>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <limits>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include <sys/ioctl.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include <diffusion_gemma/cpu/engine.hpp>
#include <diffusion_gemma/io/chat_format.hpp>
#include <diffusion_gemma/io/tokenizer.hpp>
#include <diffusion_gemma/io/trace_json.hpp>
#include <diffusion_gemma/io/utf8.hpp>
#include <diffusion_gemma/runtime/decoder.hpp>

#include "commands.hpp"
#include "common.hpp"
#include "interrupt.hpp"
#include "serve/text_stream.hpp"

namespace dgemma {

namespace dg = diffusion_gemma;

namespace {

int terminal_width() {
  winsize w{};
  if (::ioctl(2, TIOCGWINSZ, &w) == 0 && w.ws_col > 10) return w.ws_col;
  return 80;
}

// Terminal cells of one code point: 2 for East Asian wide and emoji ranges, else 1 (a close
// approximation of wcwidth that keeps the view's line count right).
int cell_width(std::uint32_t cp) {
  const bool wide = (cp >= 0x1100 && cp <= 0x115f) || (cp >= 0x2e80 && cp <= 0xa4cf) || (cp >= 0xac00 && cp <= 0xd7a3) ||
                    (cp >= 0xf900 && cp <= 0xfaff) || (cp >= 0xfe30 && cp <= 0xfe4f) || (cp >= 0xff00 && cp <= 0xff60) ||
                    (cp >= 0xffe0 && cp <= 0xffe6) || (cp >= 0x1f300 && cp <= 0x1f64f) || (cp >= 0x1f900 && cp <= 0x1f9ff) ||
                    (cp >= 0x20000 && cp <= 0x3fffd);
  return wide ? 2 : 1;
}

// Calls f(width) for each code point of valid UTF-8 text.
template <class F>
void for_each_cell(const std::string& s, F&& f) {
  for (std::size_t i = 0; i < s.size();) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    const int len = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : 4;
    std::uint32_t cp = len == 1 ? c : c & (0x3f >> (len - 1));
    for (int k = 1; k < len && i + k < s.size(); ++k) cp = (cp << 6) | (static_cast<unsigned char>(s[i + k]) & 0x3f);
    f(cp, cell_width(cp));
    i += static_cast<std::size_t>(len);
  }
}

int cells(const std::string& s) {
  int n = 0;
  for_each_cell(s, [&](std::uint32_t, int w) { n += w; });
  return n;
}

// How one token looks in the view: control characters made visible, never a line break.
std::string visible(const std::string& piece) {
  std::string out;
  for (char c : piece) {
    if (c == '\n') {
      out += "\u23ce";
    } else if (c == '\t') {
      out += "\u21e5";
    } else if (static_cast<unsigned char>(c) < 0x20) {
      out += "\u00b7";
    } else {
      out += c;
    }
  }
  return out;
}

// The live canvas view on stderr: committed text flows above it; the view (status line and the
// current argmax draft, accepted positions bright, re-noised positions dim) is redrawn in place.
class CanvasView {
 public:
  CanvasView(const dg::io::Tokenizer* tok, int width) : tok_(tok), width_(width) {}

  void draw(const dg::StepEvent& e, int canvases, int max_steps) {
    erase();
    std::ostringstream s;
    s << "\n\033[36mcanvas " << e.record.canvas + 1 << "/" << canvases << "  step " << e.record.step + 1 << "/"
      << max_steps << "  accepted " << e.record.accepted << "/" << e.length << "  mean entropy " << std::fixed
      << std::setprecision(3) << e.record.mean_entropy << "  T " << std::setprecision(3) << e.record.temperature
      << "\033[0m\n";
    int col = 0;
    int rows = 2;
    for (int i = 0; i < e.length; ++i) {
      std::string piece = tok_ && tok_->has_id(e.draft[i]) ? visible(tok_->decode(&e.draft[i], 1, false))
                                                           : "<" + std::to_string(e.draft[i]) + ">";
      if (piece.empty()) piece = "\u2205";
      const int w = cells(piece);
      if (col + w > width_) {
        s << "\n";
        ++rows;
        col = 0;
        if (rows > kMaxRows) break;
      }
      s << (e.accepted[i] ? "\033[1;97m" : "\033[2m") << piece << "\033[0m";
      col += w;
    }
    const std::string text = s.str();
    std::fputs(text.c_str(), stderr);
    std::fflush(stderr);
    drawn_rows_ = rows;  // lines below the committed text's last line
  }

  // Removes the view, leaving the cursor right after the committed text.
  void erase() {
    if (drawn_rows_ < 0) return;
    std::fprintf(stderr, "\033[%dA\033[%dG\033[J", drawn_rows_, text_col_ + 1);
    std::fflush(stderr);
    drawn_rows_ = -1;
  }

  // Committed text went to the terminal: track the column where it ends.
  void after_text(const std::string& text) {
    for_each_cell(text, [&](std::uint32_t cp, int w) {
      if (cp == '\n') {
        text_col_ = 0;
      } else {
        text_col_ = text_col_ + w > width_ ? w : text_col_ + w;
        if (text_col_ == width_) text_col_ = 0;
      }
    });
  }

 private:
  static constexpr int kMaxRows = 16;
  const dg::io::Tokenizer* tok_;
  int width_;
  int drawn_rows_ = -1;
  int text_col_ = 0;
};

}  // namespace

int cmd_generate(const std::vector<std::string>& args) {
  auto specs = sampler_flag_specs();
  const std::vector<FlagSpec> own = {
      {"model", "DIR", "checkpoint directory (default: the bundled model, models/dg-tiny-tasks)"},
      {"prompt", "TEXT", "the prompt as text"},
      {"prompt-file", "FILE", "read the prompt from a UTF-8 file (- for standard input)"},
      {"prompt-ids", "IDS", "the prompt as comma-separated token ids (no tokenizer needed)"},
      {"chat", "", "wrap the prompt as a user turn of the Gemma 4 chat format"},
      {"system", "TEXT", "system turn (with --chat)"},
      {"think", "", "thinking on (<|think|> in the system turn; with --chat)"},
      {"seed", "N", "seed of the counter-based RNG, in [0, 2^64) (default 0)"},
      {"trace", "FILE", "write one JSON line per step and per canvas"},
      {"view", "", "redraw the canvas in place as it denoises (default: on when stderr is a terminal)"},
      {"view-delay", "MS", "pause after each redraw of the view, to watch a fast model denoise (default 0)"},
      {"json", "", "print one JSON object instead of text"},
      {"memory-budget", "MIB", "refuse a request whose KV cache and workspace exceed this many MiB"},
      {"check-weights", "", "scan every weight for NaN/Inf at load"},
  };
  specs.insert(specs.begin(), own.begin(), own.end());
  for (auto& spec : engine_flag_specs(dg::cpu::precision_name(dg::cpu::EngineOptions{}.precision))) specs.push_back(spec);
  Flags f("generate",
          "Generates text by block diffusion. Committed text streams out a canvas at a time; with --view the\n"
          "canvas is redrawn each step (accepted positions bright, re-noised dim). Ctrl-C stops cleanly.",
          specs);
  if (!f.parse(args)) {
    std::cout << f.usage();
    return 0;
  }
  const int sources = f.has("prompt") + f.has("prompt-file") + f.has("prompt-ids");
  if (sources != 1) throw UsageError("give exactly one of --prompt, --prompt-file, --prompt-ids");
  if ((f.has("system") || f.flag("think")) && !f.flag("chat")) throw UsageError("--system and --think need --chat");
  const std::string dir = f.str("model", DG_DEFAULT_MODEL_DIR);
  // Flags that need no model are checked before the (possibly long) load.
  const dg::cpu::EngineOptions engine_opts = engine_options(f, dg::cpu::EngineOptions{}.precision);
  const std::uint64_t seed = f.unsigned_integer("seed", 0);
  const std::size_t budget_bytes = static_cast<std::size_t>(f.integer("memory-budget", 0, 0, 1 << 30)) << 20;
  const int view_delay_ms = static_cast<int>(f.integer("view-delay", 0, 0, 10000));
  if (f.has("trace")) refuse_overwriting_checkpoint("trace", f.str("trace"), dir);
  auto model = load_model(dir, f.flag("check-weights"));
  const auto& cfg = model->config();
  if (!cfg.is_diffusion()) throw UsageError(dir + " is not a DiffusionGemma checkpoint (model_type diffusion_gemma)");

  const std::unique_ptr<dg::io::Tokenizer> tok = load_tokenizer_if_present(dir);
  std::vector<std::int32_t> prompt;
  if (f.has("prompt-ids")) {
    if (f.flag("chat")) throw UsageError("--chat needs a text prompt");
    for (auto id : f.integers("prompt-ids", 0, cfg.vocab_size - 1)) prompt.push_back(static_cast<std::int32_t>(id));
  } else {
    if (!tok) throw dg::Error(dg::StatusCode::kNotFound, dir + "/tokenizer.json does not exist: give --prompt-ids instead of text");
    const std::string text = f.has("prompt") ? f.str("prompt") : read_utf8_input(f.str("prompt-file"));
    PromptFormat format;
    format.chat = f.flag("chat");
    format.think = f.flag("think");
    format.system = f.str("system", "");
    if (format.chat) format.empty_thought_channel = dg::io::chat_options_for(dir).empty_thought_channel;
    prompt = encode_text_prompt(*tok, cfg, text, format, "--prompt");
  }

  using TextDecoder = dg::Decoder<dg::cpu::Engine<dg::DiffusionGemmaBackbone>>;
  auto o = TextDecoder::default_options(model->generation_config());
  apply_sampler_flags(f, cfg.vocab_size, o);
  o.sampler.rng.seed = seed;
  o.memory_budget_bytes = budget_bytes;
  TextDecoder decoder(model, engine_opts);
  const auto plan = decoder.plan(static_cast<std::int64_t>(prompt.size()), o);  // refuse before any work

  const bool json = f.flag("json");
  const bool view_on = !json && f.flag("view", stderr_is_terminal() && ::isatty(1) == 1);
  std::unique_ptr<dg::io::TraceWriter> trace;  // opened (truncated) once every flag has passed
  if (f.has("trace")) trace = std::make_unique<dg::io::TraceWriter>(f.str("trace"));
  CanvasView view(tok.get(), terminal_width());

  // A signal cancels at the next step (what was committed is printed); the previous handlers come
  // back then, so that a second one ends the program.
  InterruptGuard interrupts;
  const auto keep_going = [&interrupts] {
    if (!InterruptGuard::interrupted()) return true;
    interrupts.disarm();
    return false;
  };
  // Holds back text that later canvases can still change (a UTF-8 character split across
  // canvases, a byte-fallback run), so the printed text always equals the final answer's.
  dgemma::serve::TextAssembler stream(
      [&tok](const std::vector<std::int32_t>& ids) { return decode_known(*tok, ids); }, {},
      std::numeric_limits<int>::max(),
      [&tok](std::int32_t id) { return tok->has_id(id) && tok->decodes_with_next(id); });
  const auto print_text = [&](const std::string& delta) {
    if (delta.empty()) return;
    std::fputs(delta.c_str(), stdout);
    std::fflush(stdout);
    view.after_text(delta);
  };
  dg::Callbacks cb;
  cb.on_step = [&](const dg::StepEvent& e) {
    if (trace) trace->write(e.record);
    if (view_on) {
      view.draw(e, plan.num_canvases, o.sampler.max_denoising_steps);
      if (view_delay_ms > 0) ::usleep(static_cast<useconds_t>(view_delay_ms) * 1000);
    }
    return keep_going();
  };
  cb.on_commit = [&](const dg::CommitEvent& e) {
    if (trace) trace->write(e.record);
    if (view_on) view.erase();
    if (!json) {
      if (tok) {
        print_text(stream.add(e.tokens, e.valid_tokens, false, e.final).text);
      } else {
        std::string ids;
        for (int i = 0; i < e.valid_tokens; ++i) ids += std::to_string(e.tokens[i]) + " ";
        print_text(ids);
      }
    }
    return keep_going();
  };
  const dg::GenerationResult r = decoder.generate(prompt, o, cb);
  interrupts.disarm();
  if (view_on) view.erase();
  if (!json && tok && !stream.finished()) print_text(stream.add(nullptr, 0, false, true).text);  // cancelled
  if (trace) {
    trace->write_summary(r);
    trace->close();
  }

  const std::vector<std::int32_t> out = r.text_tokens();
  const std::string text = tok ? decode_known(*tok, out) : std::string();
  const double gen_seconds = r.seconds - r.prefill_seconds;
  std::vector<int> steps;
  std::vector<std::string> stops;
  for (const auto& c : r.canvases) {
    steps.push_back(c.steps);
    stops.push_back(dg::to_string(c.stop));
  }
  if (json) {
    nlohmann::ordered_json j;
    j["text"] = text;
    j["tokens"] = out;
    j["steps"] = steps;
    j["stop"] = stops;
    j["finish"] = dg::to_string(r.finish);
    j["tokens_per_forward"] = r.tokens_per_forward;
    j["seconds"] = r.seconds;
    std::cout << j.dump() << "\n";
  } else {
    std::fputs("\n", stdout);
    std::ostringstream steps_text;
    for (std::size_t i = 0; i < steps.size(); ++i) steps_text << (i ? "," : "") << steps[i];
    std::fprintf(stderr,
                 "\n[%zu token%s, %zu canvas%s, steps per canvas %s, %.2f tokens/forward, %.1f tokens/s, "
                 "first commit after %.2f s, %s]\n",
                 out.size(), out.size() == 1 ? "" : "s", r.canvases.size(), r.canvases.size() == 1 ? "" : "es",
                 steps_text.str().c_str(), r.tokens_per_forward,
                 gen_seconds > 0 ? static_cast<double>(out.size()) / gen_seconds : 0.0, r.first_commit_seconds,
                 dg::to_string(r.finish));
  }
  // The answer must have reached standard output (a full disk fails only at the flush).
  std::cout.flush();
  if (!std::cout || std::fflush(stdout) != 0 || std::ferror(stdout)) {
    throw dg::Error(dg::StatusCode::kIoError, std::string("standard output: write failed (") + std::strerror(errno) + ")");
  }
  return r.finish == dg::Finish::kCancelled ? 130 : 0;
}

}  // namespace dgemma
