// SPDX-License-Identifier: Apache-2.0
// Encoding throughput of io::Tokenizer on English text, one core.
//
//   g++ -std=c++17 -O2 -I include -I /usr/include/eigen3 benchmarks/tokenizer_bench.cpp -o /tmp/tokbench
//   /tmp/tokbench [tokenizer.json ...]        (run from the repository root; default: the test fixtures)
//
// Two shapes of input per tokenizer: one 8 MB text (Gemma's tokenizer.json has no splitting pre-tokenizer, so
// that is a single BPE word of millions of symbols) and the same text as 2 KB documents, encoded one by one.
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <string>
#include <vector>

#include <diffusion_gemma/io/tokenizer.hpp>

namespace {

const char* const kSentences[] = {
    "The quick brown fox jumps over the lazy dog.",
    "A diffusion language model refines a whole canvas of tokens at every step.",
    "Tokenizers turn text into integer ids, and decoders turn the ids back into text.",
    "In the beginning the weather was cold, but by the afternoon the sun had warmed the valley.",
    "Numbers such as 12, 345 and 6789 appear in tables, prices and dates like 2024-06-11.",
    "What is the capital of France? The capital of France is Paris.",
    "Machine learning models are trained on large amounts of data with gradient descent.",
    "Every morning she walked to the station, bought a coffee and read the newspaper.",
    "The committee will meet on Tuesday to discuss the budget for the next year.",
    "Our results show that the new method is faster and more accurate than the baseline.",
    "History teaches us that great changes rarely happen overnight; they take patience.",
    "Please remember to bring your passport, your tickets and a warm jacket.",
    "Scientists observed that the population of birds increased after the wetlands were restored.",
    "He opened the window, listened to the rain, and decided to stay home for the evening.",
};

// Deterministic English: sentences in a pseudo-random order, paragraphs separated by blank lines.
std::string english_text(std::size_t bytes) {
  std::string out;
  out.reserve(bytes + 256);
  std::uint64_t state = 0x243f6a8885a308d3ull;
  const std::size_t n = sizeof(kSentences) / sizeof(kSentences[0]);
  int in_paragraph = 0;
  while (out.size() < bytes) {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    out += kSentences[(state >> 33) % n];
    if (++in_paragraph == 6) {
      out += "\n\n";
      in_paragraph = 0;
    } else {
      out += ' ';
    }
  }
  return out;
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// Best of `reps` runs, in MB/s (1 MB = 1e6 bytes).
template <class F>
double best_mb_per_s(std::size_t bytes, int reps, F&& run) {
  double best = 1e30;
  for (int r = 0; r < reps; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    run();
    best = std::min(best, seconds_since(t0));
  }
  return static_cast<double>(bytes) / best / 1e6;
}

}  // namespace

int main(int argc, char** argv) {
  using diffusion_gemma::io::Tokenizer;
  std::vector<std::string> files;
  for (int i = 1; i < argc; ++i) files.emplace_back(argv[i]);
  if (files.empty()) {
    files = {"tests/fixtures/tokenizers/gemma_bpe_4000.json", "tests/fixtures/tokenizers/gemma_bpe_1000.json",
             "tests/fixtures/tokenizers/llama_style_2000.json"};
  }
  const std::string text = english_text(8u << 20);
  std::vector<std::string> docs;
  for (std::size_t i = 0; i < text.size(); i += 2048) docs.push_back(text.substr(i, 2048));

  try {
    for (const std::string& file : files) {
      const auto t0 = std::chrono::steady_clock::now();
      const Tokenizer tok = Tokenizer::from_file(file);
      const double load_s = seconds_since(t0);
      std::size_t n_ids = 0;
      const double whole = best_mb_per_s(text.size(), 3, [&] { n_ids = tok.encode(text).size(); });
      std::size_t sink = 0;
      const double per_doc = best_mb_per_s(text.size(), 3, [&] {
        for (const std::string& d : docs) sink += tok.encode(d).size();
      });
      const std::vector<int> ids = tok.encode(text);
      std::size_t out_bytes = 0;
      const double dec = best_mb_per_s(text.size(), 3, [&] { out_bytes = tok.decode(ids).size(); });
      std::printf("%s: vocab %d, load %.3f s, %.2f bytes/token\n", file.c_str(), tok.vocab_size(), load_s,
                  static_cast<double>(text.size()) / static_cast<double>(n_ids));
      std::printf("  encode one %.1f MB text : %7.2f MB/s\n", static_cast<double>(text.size()) / 1e6, whole);
      std::printf("  encode 2 KB documents  : %7.2f MB/s\n", per_doc);
      std::printf("  decode                 : %7.2f MB/s%s\n", dec,
                  out_bytes == text.size() ? "" : " (round trip differs!)");
      if (sink == 0) std::printf("  (no ids?)\n");
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "tokenizer_bench: %s\n", e.what());
    return 1;
  }
  return 0;
}
