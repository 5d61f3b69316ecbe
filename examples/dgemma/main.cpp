// SPDX-License-Identifier: Apache-2.0
// dgemma: run DiffusionGemma checkpoints from the command line, and the porting aid that the
// reference tests use. `dgemma --help` lists the subcommands.
#include <cstdio>
#include <iostream>
#include <string>
#include <vector>

#include <diffusion_gemma/core/status.hpp>
#include <diffusion_gemma/version.hpp>

#include "cli.hpp"
#include "commands.hpp"

namespace {

const char* kUsage =
    "usage: dgemma <command> [flags]\n"
    "\n"
    "commands:\n"
    "  generate     text or ids in, text out, with a live view of the canvas as it denoises\n"
    "  batch        every prompt of a JSON Lines file, many sequences per pass, JSON Lines out\n"
    "  serve        an OpenAI-compatible HTTP server (chat, completions, streaming, metrics)\n"
    "  info         config summary, parameter counts, memory for weights and KV cache\n"
    "  quantize     write a compressed-tensors checkpoint (w4a16, w8a16, int8, fp8)\n"
    "  dequantize   a quantized checkpoint's matrices as F32 safetensors (for comparing tools)\n"
    "  tokenize     text -> ids as a JSON array\n"
    "  detokenize   ids -> text\n"
    "  parity       encoder and denoiser logits for given ids, as safetensors (porting aid)\n"
    "  replay       generate with draws recorded from transformers (parity aid)\n"
    "\n"
    "`dgemma <command> --help` describes each command's flags.\n";

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> args(argv + 1, argv + argc);
  if (args.empty() || args[0] == "--help" || args[0] == "-h" || args[0] == "help") {
    // Without a command the usage is the error message, so it goes where errors go.
    (args.empty() ? std::cerr : std::cout) << kUsage;
    return args.empty() ? 2 : 0;
  }
  if (args[0] == "--version") {
    std::cout << "dgemma " << diffusion_gemma::kVersionString << "\n";
    return 0;
  }
  const std::string cmd = args[0];
  args.erase(args.begin());
  try {
    if (cmd == "parity") return dgemma::cmd_parity(args);
    if (cmd == "replay") return dgemma::cmd_replay(args);
    if (cmd == "generate") return dgemma::cmd_generate(args);
    if (cmd == "batch") return dgemma::cmd_batch(args);
    if (cmd == "serve") return dgemma::cmd_serve(args);
    if (cmd == "info") return dgemma::cmd_info(args);
    if (cmd == "quantize") return dgemma::cmd_quantize(args);
    if (cmd == "dequantize") return dgemma::cmd_dequantize(args);
    if (cmd == "tokenize") return dgemma::cmd_tokenize(args, false);
    if (cmd == "detokenize") return dgemma::cmd_tokenize(args, true);
    std::fprintf(stderr, "dgemma: unknown command '%s'\n\n%s", cmd.c_str(), kUsage);
    return 2;
  } catch (const dgemma::UsageError& e) {
    std::fprintf(stderr, "dgemma %s: %s\n", cmd.c_str(), e.what());
    return 2;
  } catch (const diffusion_gemma::Error& e) {
    std::fprintf(stderr, "dgemma %s: error: %s\n", cmd.c_str(), e.what());
    return 1;
  } catch (const std::bad_alloc&) {
    std::fprintf(stderr, "dgemma %s: error: out of memory\n", cmd.c_str());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "dgemma %s: error: %s\n", cmd.c_str(), e.what());
    return 1;
  }
}
