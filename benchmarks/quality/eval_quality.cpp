// SPDX-License-Identifier: Apache-2.0
// Exact-match accuracy of this library on a held-out task set (tools/train/data/test.jsonl), in the
// same JSON schema as tools/train/eval_transformers.py, so benchmarks/quality/compare.py can put the
// two side by side. Definition (identical to the transformers script): the decoded text before the
// first stop id equals the answer, and a stop id was generated.
//
//   eval_quality --model models/dg-tiny-tasks --data tools/train/data/test.jsonl
//                --out benchmarks/quality/dgemma_results.json [--steps 48,1,2,4,8,16] [--threads 2] [--seed 0]
//                [--precision exact|fast]
//                [--max-errors 3]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include <diffusion_gemma/cpu/engine.hpp>
#include <diffusion_gemma/io/tokenizer.hpp>
#include <diffusion_gemma/runtime/decoder.hpp>

namespace dg = diffusion_gemma;
using Json = nlohmann::ordered_json;

namespace {

std::string arg(int argc, char** argv, const char* name, const std::string& fallback) {
  for (int i = 1; i + 1 < argc; ++i)
    if (std::strcmp(argv[i], name) == 0) return argv[i + 1];
  return fallback;
}

double mean(const std::vector<double>& v) {
  double s = 0;
  for (double x : v) s += x;
  return v.empty() ? 0.0 : s / static_cast<double>(v.size());
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  if (v.empty()) return 0.0;
  const std::size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

}  // namespace

int main(int argc, char** argv) {
  const std::string dir = arg(argc, argv, "--model", "models/dg-tiny-tasks");
  const std::string data = arg(argc, argv, "--data", "tools/train/data/test.jsonl");
  const std::string out_path = arg(argc, argv, "--out", "benchmarks/quality/dgemma_results.json");
  const std::string steps_arg = arg(argc, argv, "--steps", "48,1,2,4,8,16");
  const int threads = std::atoi(arg(argc, argv, "--threads", "2").c_str());
  const std::uint64_t seed = std::strtoull(arg(argc, argv, "--seed", "0").c_str(), nullptr, 10);
  const int max_errors = std::atoi(arg(argc, argv, "--max-errors", "3").c_str());  // wrong answers kept per task
  dg::cpu::Precision precision = dg::cpu::EngineOptions{}.precision;
  if (!dg::cpu::parse_precision(arg(argc, argv, "--precision", dg::cpu::precision_name(precision)), &precision)) {
    std::fprintf(stderr, "--precision must be exact or fast\n");
    return 2;
  }

  auto model = dg::cpu::Model::load(dir);
  const auto tok = dg::io::Tokenizer::from_file(dir + "/tokenizer.json");
  dg::cpu::EngineOptions eo;
  eo.threads = threads;
  eo.precision = precision;
  dg::Decoder<dg::cpu::Engine<dg::DiffusionGemmaBackbone>> decoder(model, eo);
  const auto base = decoder.default_options(model->generation_config());

  struct Row {
    std::string task, question, answer;
    std::vector<std::int32_t> prompt;
  };
  std::vector<Row> rows;
  std::vector<std::string> tasks;
  {
    std::ifstream in(data);
    if (!in) {
      std::fprintf(stderr, "cannot open %s\n", data.c_str());
      return 1;
    }
    std::string line;
    while (std::getline(in, line)) {
      if (line.empty()) continue;
      const auto j = Json::parse(line);
      Row r{j.at("task"), j.at("question"), j.at("answer"), {}};
      for (int id : tok.encode(j.at("prompt").get<std::string>(), false)) r.prompt.push_back(id);
      if (std::find(tasks.begin(), tasks.end(), r.task) == tasks.end()) tasks.push_back(r.task);
      rows.push_back(std::move(r));
    }
  }
  const auto& stop_ids = base.scheduler.stop_token_ids;

  Json results;
  results["model"] = dir;
  results["implementation"] = "diffusion_gemma (CPU, " + decoder.engine().kernels().path() + ")";
  results["precision"] = dg::cpu::precision_name(precision);
  results["cpu"] = dg::cpu::cpu_features().brand;
  results["threads"] = dg::cpu::max_threads();
  results["seed"] = seed;
  results["canvas_length"] = model->config().canvas_length;
  results["exact_match_definition"] = "decoded text before the first stop id == answer, and a stop id was generated";
  Json n_per_task = Json::object();
  for (const auto& t : tasks) n_per_task[t] = std::count_if(rows.begin(), rows.end(), [&](const Row& r) { return r.task == t; });
  results["n_per_task"] = n_per_task;
  results["settings"] = Json::array();

  std::size_t pos = 0;
  while (pos <= steps_arg.size()) {
    const std::size_t comma = steps_arg.find(',', pos);
    const int n_steps = std::atoi(steps_arg.substr(pos, comma - pos).c_str());
    pos = comma == std::string::npos ? steps_arg.size() + 1 : comma + 1;
    auto o = base;
    o.sampler.max_denoising_steps = n_steps;
    const auto t0 = std::chrono::steady_clock::now();
    struct Acc {
      int correct = 0, n = 0;
      std::vector<double> tpf, steps;
      std::map<int, int> canvases;
      Json errors = Json::array();
    };
    std::map<std::string, Acc> per_task;
    for (std::size_t i = 0; i < rows.size(); ++i) {
      const Row& r = rows[i];
      o.sampler.rng.seed = seed + i;
      const auto g = decoder.generate(r.prompt, o);
      std::size_t stop_at = g.tokens.size();
      for (std::size_t k = 0; k < g.tokens.size(); ++k) {
        if (std::find(stop_ids.begin(), stop_ids.end(), g.tokens[k]) != stop_ids.end()) {
          stop_at = k;
          break;
        }
      }
      const bool stopped = stop_at < g.tokens.size();
      const std::vector<int> text_ids(g.tokens.begin(), g.tokens.begin() + static_cast<std::ptrdiff_t>(stop_at));
      const std::string text = tok.decode(text_ids, /*skip_special_tokens=*/false);
      const bool ok = stopped && text == r.answer;
      Acc& a = per_task[r.task];
      ++a.n;
      a.correct += ok;
      a.tpf.push_back(g.tokens_per_forward);
      for (const auto& c : g.canvases) a.steps.push_back(c.steps);
      ++a.canvases[static_cast<int>(g.canvases.size())];
      if (!ok && static_cast<int>(a.errors.size()) < max_errors) a.errors.push_back({{"question", r.question}, {"answer", r.answer}, {"got", text}, {"stopped", stopped}});
    }
    const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    Json setting;
    setting["max_denoising_steps"] = n_steps;
    setting["wall_s"] = wall;
    setting["tasks"] = Json::object();
    std::vector<double> all_steps, all_tpf;
    int all_c = 0, all_n = 0;
    std::map<int, int> hist;
    for (const auto& t : tasks) {
      Acc& a = per_task[t];
      Json c = Json::object();
      for (const auto& kv : a.canvases) c[std::to_string(kv.first)] = kv.second;
      setting["tasks"][t] = {{"exact_match", static_cast<double>(a.correct) / a.n}, {"correct", a.correct}, {"n", a.n},
                             {"tokens_per_forward_mean", mean(a.tpf)}, {"steps_per_canvas_mean", mean(a.steps)},
                             {"steps_per_canvas_median", median(a.steps)},
                             {"steps_per_canvas_max", a.steps.empty() ? 0.0 : *std::max_element(a.steps.begin(), a.steps.end())},
                             {"canvases_per_answer", c}, {"errors", a.errors}};
      all_steps.insert(all_steps.end(), a.steps.begin(), a.steps.end());
      all_tpf.insert(all_tpf.end(), a.tpf.begin(), a.tpf.end());
      all_c += a.correct;
      all_n += a.n;
    }
    int cap = 0;
    for (double s : all_steps) {
      ++hist[static_cast<int>(s)];
      cap += static_cast<int>(s) == n_steps;
    }
    Json h = Json::object();
    for (const auto& kv : hist) h[std::to_string(kv.first)] = kv.second;
    setting["overall"] = {{"exact_match", static_cast<double>(all_c) / all_n}, {"tokens_per_forward_mean", mean(all_tpf)},
                          {"steps_per_canvas_mean", mean(all_steps)}, {"steps_per_canvas_median", median(all_steps)},
                          {"steps_per_canvas_histogram", h}, {"canvases_hitting_cap", cap},
                          {"canvases", all_steps.size()}};
    std::printf("[eval] steps=%2d", n_steps);
    for (const auto& t : tasks) std::printf(" %s=%.2f", t.c_str(), setting["tasks"][t]["exact_match"].get<double>());
    std::printf(" | overall %.3f tpf %.2f steps/canvas mean %.2f (%.1fs)\n", static_cast<double>(all_c) / all_n,
                mean(all_tpf), mean(all_steps), wall);
    std::fflush(stdout);
    results["settings"].push_back(setting);
  }
  std::ofstream(out_path) << results.dump(1) << "\n";
  std::printf("wrote %s\n", out_path.c_str());
  return 0;
}
