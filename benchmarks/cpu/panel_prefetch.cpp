// SPDX-License-Identifier: Apache-2.0
// The AVX2 exact product of a BF16 weight (pair tiles, as the engine stores it) with and without
// the request for the next weight blocks (kernels::PanelPrefetcher), alternating in one process so
// that the machine's slow and fast phases fall on both sides. The weights rotate over copies that
// together exceed the last-level cache, as an encoder pass's experts do. One thread. Prints JSON:
// per shape the fp32 GFLOP/s of each side and the quartiles of the per-round ratio off/on.
//
//   panel_prefetch [--rows 16,32,64,128,512] [--k 1024] [--n 1024] [--rounds 12] [--mib 96]
//
// Benchmarks measure; nothing gates on time.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include <diffusion_gemma/cpu/isa.hpp>
#include <diffusion_gemma/cpu/kernels/avx2.hpp>

namespace dg = diffusion_gemma;
namespace kn = dg::cpu::kernels;

namespace {

std::string arg(int argc, char** argv, const std::string& name, const std::string& fallback) {
  for (int i = 1; i + 1 < argc; ++i) {
    if (name == argv[i]) return argv[i + 1];
  }
  return fallback;
}

#if DG_X86_KERNELS
// gemm_pairs with the request switched on or off: the same blocks and bits either way.
void product(bool prefetch, const std::uint16_t* w, const float* a, std::int64_t m, std::int64_t n, std::int64_t k,
             float* c) {
  kn::avx2::gemm_pairs(w, a, k, m, n, k, c, n, false, prefetch);
}
#endif

}  // namespace

int main(int argc, char** argv) {
  nlohmann::ordered_json out;
  out["cpu"] = dg::cpu::cpu_features().brand;
  out["cpu_flags"] = dg::cpu::cpu_features().flags();
#if DG_X86_KERNELS
  if (dg::cpu::cpu_features().best() < dg::cpu::Isa::kAvx2) {
    std::cerr << "panel_prefetch: this CPU has no AVX2\n";
    return 2;
  }
  std::vector<std::int64_t> rows;
  {
    std::stringstream ss(arg(argc, argv, "--rows", "16,32,64,128,512"));
    for (std::string item; std::getline(ss, item, ',');) rows.push_back(std::stoll(item));
  }
  const std::int64_t k = std::stoll(arg(argc, argv, "--k", "1024")), n = std::stoll(arg(argc, argv, "--n", "1024"));
  const int rounds = std::max(2, std::stoi(arg(argc, argv, "--rounds", "12")));
  const double mib = std::stod(arg(argc, argv, "--mib", "96"));
  if (k <= 0 || n <= 0 || n % kn::kPairPanelWidth != 0) {
    std::cerr << "panel_prefetch: --k must be positive and --n a positive multiple of 16\n";
    return 2;
  }
  std::mt19937 gen(1);
  std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
  const std::size_t elements = kn::pair_panel_offset(n, k);
  const int copies = std::max(2, static_cast<int>(mib * 1048576.0 / (static_cast<double>(elements) * 2.0)));
  std::vector<std::vector<std::uint16_t>> weights(static_cast<std::size_t>(copies), std::vector<std::uint16_t>(elements));
  for (auto& w : weights) {
    for (auto& v : w) {
      const float f = uniform(gen);
      std::uint32_t bits;
      std::memcpy(&bits, &f, 4);
      v = static_cast<std::uint16_t>(bits >> 16);
    }
  }
  out["k"] = k;
  out["n"] = n;
  out["weight_copies"] = copies;
  out["rounds"] = rounds;
  for (const std::int64_t m : rows) {
    std::vector<float> a(static_cast<std::size_t>(m * k)), c(static_cast<std::size_t>(m * n));
    for (float& v : a) v = uniform(gen);
    std::vector<double> ratio;
    double seconds[2] = {0.0, 0.0};
    for (int r = 0; r < rounds; ++r) {
      double t[2];
      for (int side = 0; side < 2; ++side) {
        const bool on = (side + r) % 2 == 1;  // alternate which side goes first
        const auto t0 = std::chrono::steady_clock::now();
        for (const auto& w : weights) product(on, w.data(), a.data(), m, n, k, c.data());
        t[on] = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      }
      ratio.push_back(t[0] / t[1]);
      seconds[0] += t[0];
      seconds[1] += t[1];
    }
    std::sort(ratio.begin(), ratio.end());
    const double gflop = 2.0 * static_cast<double>(m * k * n) * copies * rounds / 1e9;
    nlohmann::ordered_json row;
    row["rows"] = m;
    row["gflops_without"] = gflop / seconds[0];
    row["gflops_with"] = gflop / seconds[1];
    row["ratio_median"] = ratio[ratio.size() / 2];
    row["ratio_quartiles"] = {ratio[ratio.size() / 4], ratio[3 * ratio.size() / 4]};
    out["shapes"].push_back(row);
    std::fprintf(stderr, "rows %lld: without %.1f, with %.1f GFLOP/s, ratio %.3f\n", static_cast<long long>(m),
                 gflop / seconds[0], gflop / seconds[1], ratio[ratio.size() / 2]);
  }
  std::cout << out.dump(2) << "\n";
  return 0;
#else
  std::cerr << "panel_prefetch: x86 only\n";
  (void)argc;
  (void)argv;
  return 2;
#endif
}
