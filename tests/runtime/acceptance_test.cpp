// SPDX-License-Identifier: Apache-2.0
// Entropy-bound acceptance where equal entropies meet the bound: which of several equally certain
// positions transformers accepts depends on torch.sort's (unstable) order. The rows and
// transformers' accepted masks come from tools/reference/make_acceptance_fixtures.py.
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include <diffusion_gemma/io/json_file.hpp>
#include <diffusion_gemma/sampler/acceptance.hpp>

#include "support/catch.hpp"
#include "support/paths.hpp"

using namespace diffusion_gemma;

TEST_CASE("entropy-bound acceptance breaks ties as transformers' torch.sort does", "[sampler][golden]") {
  const io::Json j = io::read_json_file(dg_test::fixture("sampler/acceptance_ties.json"));
  const auto& rows = j.at("rows");
  REQUIRE(rows.size() >= 15);
  int differs_from_lowest_position_first = 0;
  for (std::size_t r = 0; r < rows.size(); ++r) {
    const auto& row = rows[r];
    const int C = row.at("canvas_length").get<int>();
    INFO("row " << r << ", C " << C);
    std::vector<float> entropy;
    for (const auto bits : row.at("entropy_f32_bits").get<std::vector<std::uint32_t>>()) {
      float f;
      std::memcpy(&f, &bits, 4);
      entropy.push_back(f);
    }
    REQUIRE(static_cast<int>(entropy.size()) == C);
    const std::vector<std::int32_t> ids(static_cast<std::size_t>(C), 0);
    const StepView view{ids.data(), ids.data(), entropy.data(), C, 0, 10};
    EntropyBound::Arguments a;
    a.entropy_bound = row.at("entropy_bound").get<double>();
    EntropyBound::State state;
    std::vector<std::uint8_t> accepted(static_cast<std::size_t>(C));
    EntropyBound::accept(a, view, state, accepted.data());
    const auto want = row.at("accepted").get<std::vector<int>>();
    CHECK(std::vector<int>(accepted.begin(), accepted.end()) == want);
    // The rule "equal entropies: lower position first" accepts the same number of positions but
    // not always the same ones; count the rows where it would have failed.
    std::vector<int> lowest_first(static_cast<std::size_t>(C), 0);
    {
      std::vector<int> order(static_cast<std::size_t>(C));
      for (int i = 0; i < C; ++i) order[static_cast<std::size_t>(i)] = i;
      std::stable_sort(order.begin(), order.end(), [&](int x, int y) { return entropy[x] < entropy[y]; });
      double cum = 0.0;
      for (const int p : order) {
        cum += entropy[static_cast<std::size_t>(p)];
        lowest_first[static_cast<std::size_t>(p)] =
            math::entropy_bound_accepts(cum, entropy[static_cast<std::size_t>(p)], static_cast<float>(a.entropy_bound));
      }
    }
    differs_from_lowest_position_first += lowest_first != want;
  }
  // The fixture is only a test of tie order if that order matters in it.
  CHECK(differs_from_lowest_position_first > 0);
}
