// SPDX-License-Identifier: Apache-2.0
// dgemma quantize: a float checkpoint in, a compressed-tensors checkpoint out (docs/quantization.md).
// It streams: the output is planned from the input's header (names, shapes, bytes), each shard's
// header is written first, then one tensor at a time is read from the memory map, quantised and
// appended, and its source pages are released. Peak memory is one matrix in fp32 plus its
// quantised form, whatever the checkpoint's size.
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <dirent.h>
#include <fstream>
#include <functional>
#include <iostream>
#include <regex>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include <diffusion_gemma/cpu/kernels/dequantize.hpp>
#include <diffusion_gemma/io/config.hpp>
#include <diffusion_gemma/io/load.hpp>
#include <diffusion_gemma/io/json_file.hpp>
#include <diffusion_gemma/io/quantization_config.hpp>
#include <diffusion_gemma/io/quantize.hpp>
#include <diffusion_gemma/io/safetensors.hpp>
#include <diffusion_gemma/io/safetensors_writer.hpp>
#include <diffusion_gemma/io/weights.hpp>
#include <diffusion_gemma/model/weights.hpp>

#include "commands.hpp"
#include "common.hpp"

namespace dgemma {

namespace dg = diffusion_gemma;

namespace {

// One unit of output: a tensor copied as it is, or a matrix (possibly a row block of one expert of
// a fused tensor) quantised into several tensors.
struct OutputTensor {
  std::string module;             // output module name (quantised) or tensor name (copied)
  const dg::RawTensor* source = nullptr;
  std::string source_name;        // the tensor `source` is, in the input checkpoint
  std::int64_t row0 = 0, rows = 0, cols = 0;  // the matrix inside `source` (quantised items)
  bool quantize = false;
  dg::DType scale_dtype = dg::DType::kSentinel;  // the source matrix's own dtype (quantised items)
  std::vector<dg::io::TensorSpec> outputs;
  std::uint64_t bytes() const {
    std::uint64_t n = 0;
    for (const auto& t : outputs) n += t.nbytes();
    return n;
  }
};

bool is_float(dg::DType t) { return t == dg::DType::kF32 || t == dg::DType::kBF16 || t == dg::DType::kF16; }

// Lets the kernel drop the pages of a source range we are done with (they stay in the page cache).
void release(const std::byte* data, std::size_t bytes) {
  const std::size_t page = 4096;
  const auto a = (reinterpret_cast<std::uintptr_t>(data) + page - 1) / page * page;
  const auto b = (reinterpret_cast<std::uintptr_t>(data) + bytes) / page * page;
  if (b > a) ::madvise(reinterpret_cast<void*>(a), b - a, MADV_DONTNEED);
}

// Elements [first, first + n) of a float tensor as fp32.
void widen(const dg::RawTensor& t, std::int64_t first, std::int64_t n, float* out) {
  const std::byte* p = t.data + first * static_cast<std::int64_t>(dg::dtype_size(t.dtype));
  for (std::int64_t k = 0; k < n; ++k) {
    std::uint16_t h;
    switch (t.dtype) {
      case dg::DType::kBF16:
        std::memcpy(&h, p + 2 * k, 2);
        out[k] = dg::bfloat16::from_bits(h).to_float();
        break;
      case dg::DType::kF16:
        std::memcpy(&h, p + 2 * k, 2);
        out[k] = dg::float16::from_bits(h).to_float();
        break;
      default: std::memcpy(out + k, p + 4 * k, 4);
    }
  }
}

void write_text(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary);
  out << text;
  out.flush();
  if (!out) throw dg::Error(dg::StatusCode::kIoError, path + ": cannot write");
}

void copy_file(const std::string& from, const std::string& to) {
  std::ifstream in(from, std::ios::binary);
  std::ofstream out(to, std::ios::binary);
  // An empty file reads as "no characters inserted", which sets failbit on `out`: not an error.
  if (in && in.peek() != std::ifstream::traits_type::eof()) out << in.rdbuf();
  out.flush();
  if (!in.good() && !in.eof()) throw dg::Error(dg::StatusCode::kIoError, "cannot read " + from);
  if (!out) throw dg::Error(dg::StatusCode::kIoError, "cannot copy " + from + " to " + to);
}

// The output directory: created, or an existing empty one. A directory that holds anything is
// refused, so that no file of the user's (a README.md, a tokenizer.json, an earlier run's shards)
// is overwritten or left beside the new checkpoint.
// Returns whether it created the directory.
bool prepare_output_dir(const std::string& dst) {
  struct stat st {};
  if (::stat(dst.c_str(), &st) != 0) {
    if (::mkdir(dst.c_str(), 0755) != 0) throw dg::Error(dg::StatusCode::kIoError, dst + ": cannot create: " + std::strerror(errno));
    return true;
  }
  if (!S_ISDIR(st.st_mode)) throw dg::Error(dg::StatusCode::kInvalidArgument, dst + ": exists and is not a directory");
  if (::access((dst + "/model.safetensors.index.json").c_str(), F_OK) == 0 ||
      ::access((dst + "/model.safetensors").c_str(), F_OK) == 0) {
    throw dg::Error(dg::StatusCode::kInvalidArgument, dst + ": already holds a checkpoint; choose an empty directory");
  }
  DIR* d = ::opendir(dst.c_str());
  if (d == nullptr) throw dg::Error(dg::StatusCode::kIoError, dst + ": cannot open: " + std::strerror(errno));
  std::string first;
  while (const dirent* e = ::readdir(d)) {
    const std::string n = e->d_name;
    if (n != "." && n != "..") {
      first = n;
      break;
    }
  }
  ::closedir(d);
  if (!first.empty()) {
    throw dg::Error(dg::StatusCode::kInvalidArgument,
                    dst + ": is not empty (it holds '" + first + "'); choose a new or empty directory");
  }
  return false;
}

// What a run has written, removed again unless the run completes: a failed run (a non-finite
// weight found half-way, a full disk) leaves no partial checkpoint, and the same command can be
// run again on the same --out.
class PartialOutput {
 public:
  PartialOutput(std::string dir, bool created) : dir_(std::move(dir)), created_(created) {}
  PartialOutput(const PartialOutput&) = delete;
  PartialOutput& operator=(const PartialOutput&) = delete;
  ~PartialOutput() {
    if (done_) return;
    for (const auto& f : files_) ::unlink(f.c_str());
    if (created_) ::rmdir(dir_.c_str());
  }
  const std::string& add(const std::string& name) { return files_.emplace_back(dir_ + "/" + name); }
  void keep() { done_ = true; }

 private:
  std::string dir_;
  bool created_;
  bool done_ = false;
  std::vector<std::string> files_;
};

}  // namespace

int cmd_quantize(const std::vector<std::string>& args) {
  Flags f("quantize",
          "Quantises a BF16/F16/F32 checkpoint's Linear weights by round-to-nearest and writes a\n"
          "compressed-tensors checkpoint (sharded safetensors + model.safetensors.index.json) in the layout\n"
          "llm-compressor writes, which this library loads (transformers' from_pretrained does not: see\n"
          "docs/quantization.md section 3). Experts are written one matrix each. The embedding, norms,\n"
          "router and self-conditioning MLP stay in the source dtype. Refused: NaN or Inf weights, a\n"
          "checkpoint that does not match its config.json. A failed run removes what it wrote.",
          {{"model", "DIR", "source checkpoint directory"},
           {"out", "DIR", "output directory (created, or an existing empty one)"},
           {"scheme", "S", "w4a16 (int4, packed), w8a16 (int8, packed), int8 (W8A8 layout) or fp8 (E4M3)"},
           {"group-size", "N", "input columns per scale: 32, 64 or 128 (default: 64 for w4a16, per channel otherwise)"},
           {"asymmetric", "", "asymmetric integers with zero points (w4a16 and w8a16)"},
           {"shard-size", "MIB", "tensor bytes per shard in MiB, beside each shard's header (default 4096; fractions allowed)"}});
  if (!f.parse(args)) {
    std::cout << f.usage();
    return 0;
  }
  const std::string src = f.required("model"), dst = f.required("out");
  dg::io::QuantizeSpec spec;
  if (!dg::io::parse_quant_scheme(f.required("scheme"), &spec.scheme)) {
    throw UsageError("--scheme must be w4a16, w8a16, int8 or fp8 (got '" + f.str("scheme") + "')");
  }
  spec.group_size = f.integer("group-size", spec.scheme == dg::io::QuantScheme::kW4A16 ? 64 : 0, 0, 1 << 20);
  if (f.has("group-size") && spec.group_size != 32 && spec.group_size != 64 && spec.group_size != 128) {
    throw UsageError("--group-size must be 32, 64 or 128");
  }
  spec.symmetric = !f.flag("asymmetric");
  if (!spec.symmetric && spec.scheme != dg::io::QuantScheme::kW4A16 && spec.scheme != dg::io::QuantScheme::kW8A16) {
    throw UsageError("--asymmetric applies to w4a16 and w8a16 only");
  }
  const auto shard_limit = static_cast<std::uint64_t>(f.number("shard-size", 4096, 0.01, 1 << 24) * 1048576.0);

  if (::access(src.c_str(), F_OK) != 0) throw dg::Error(dg::StatusCode::kNotFound, src + ": model directory does not exist");
  const dg::ModelConfig cfg = dg::io::load_model_config(src);
  if (dg::io::load_quantization_config(src).quantized()) {
    throw dg::Error(dg::StatusCode::kInvalidArgument, src + ": the checkpoint is already quantized");
  }
  const dg::io::Checkpoint ckpt(src);
  // Every tensor the model needs, with its shape, and none it does not know: what loading the
  // source would refuse is refused before anything is written, not found when loading the output.
  (void)dg::io::bind_weights(ckpt, cfg);
  const std::string pre = dg::io::backbone_prefix(ckpt, cfg);

  // Which tensors are Linear weights: the model's matrices (not the embedding), and experts.
  std::vector<std::string> linear;
  std::vector<std::pair<std::string, dg::ParamSpec>> fused;
  {
    dg::ModelWeights shapes;
    shapes.layers.resize(cfg.layers.size());
    dg::for_each_parameter(cfg, shapes, [&](const dg::ParamSpec& p, dg::Weight&) {
      if (!p.is_matrix() || p.param == dg::Param::kEmbedTokens) return;
      if (p.param == dg::Param::kExpertsGateUp || p.param == dg::Param::kExpertsDown) {
        fused.emplace_back(pre + p.name, p);
      } else {
        linear.push_back(pre + p.name);
      }
    });
  }
  const std::regex split_expert(R"(.*\.experts\.\d+\.(gate|up|down)_proj\.weight$)");
  std::vector<dg::io::ModulePattern> ignore;
  for (const auto& p : dg::io::default_ignore()) ignore.emplace_back(p);
  const auto ignored = [&](const std::string& module) {
    for (const auto& p : ignore)
      if (p.matches(module, "Linear")) return true;
    return false;
  };

  std::vector<OutputTensor> items;
  const auto add_quantized = [&](const std::string& module, const std::string& tensor, const dg::RawTensor* t,
                                 std::int64_t row0, std::int64_t rows, std::int64_t cols) {
    if (spec.group_size > 0 && cols % spec.group_size != 0) {
      throw dg::Error(dg::StatusCode::kInvalidArgument,
                      "--group-size " + std::to_string(spec.group_size) + " does not divide the " + std::to_string(cols) +
                          " input features of " + module + "; use a group size that divides every width (32 or 64)");
    }
    OutputTensor it;
    it.module = module;
    it.source = t;
    it.source_name = tensor;
    it.row0 = row0;
    it.rows = rows;
    it.cols = cols;
    it.quantize = true;
    it.scale_dtype = t->dtype;  // scales and rounding follow each matrix's dtype, as compressed-tensors does
    items.push_back(std::move(it));
  };
  for (const std::string& name : ckpt.names()) {
    const dg::RawTensor& t = ckpt.find(name)->tensor;
    const std::string module = name.size() > 7 && name.compare(name.size() - 7, 7, ".weight") == 0
                                   ? name.substr(0, name.size() - 7)
                                   : name;
    const auto fused_it = std::find_if(fused.begin(), fused.end(), [&](const auto& x) { return x.first == name; });
    const bool is_linear = std::find(linear.begin(), linear.end(), name) != linear.end() ||
                           (std::regex_match(name, split_expert) && t.shape.rank == 2);
    if (fused_it != fused.end() && is_float(t.dtype) && t.shape.rank == 3 && !ignored(name)) {
      // Split the fused experts as published releases do: gate rows, up rows, down.
      const std::string base = name.substr(0, name.rfind('.') + 1);  // "...layers.L.experts."
      const std::int64_t E = t.shape[0], rows = t.shape[1], cols = t.shape[2];
      const bool gate_up = fused_it->second.param == dg::Param::kExpertsGateUp;
      for (std::int64_t e = 0; e < E; ++e) {
        const std::string m = base + std::to_string(e) + ".";
        if (gate_up) {
          add_quantized(m + "gate_proj", name, &t, e * rows, rows / 2, cols);
          add_quantized(m + "up_proj", name, &t, e * rows + rows / 2, rows / 2, cols);
        } else {
          add_quantized(m + "down_proj", name, &t, e * rows, rows, cols);
        }
      }
    } else if (is_linear && is_float(t.dtype) && !ignored(module)) {
      add_quantized(module, name, &t, 0, t.shape[0], t.shape[1]);
    } else {
      OutputTensor it;
      it.module = name;
      it.source = &t;
      it.outputs.push_back({name, t.dtype, t.shape});
      items.push_back(std::move(it));
    }
  }
  const auto spec_of = [&](const OutputTensor& it) {
    dg::io::QuantizeSpec s = spec;
    s.scale_dtype = it.scale_dtype;
    return s;
  };
  std::size_t quantized_count = 0;
  for (OutputTensor& it : items) {
    if (!it.quantize) continue;
    ++quantized_count;
    for (auto& t : dg::io::planned_tensors(it.rows, it.cols, spec_of(it))) {
      it.outputs.push_back({it.module + t.suffix, t.dtype, t.shape});
    }
  }
  if (quantized_count == 0) throw dg::Error(dg::StatusCode::kInvalidArgument, src + ": no Linear weight to quantize");

  // Shards in item order, each at most shard_limit bytes (an item larger than that gets its own).
  std::vector<std::vector<std::size_t>> shards(1);
  std::uint64_t in_shard = 0, total = 0;
  for (std::size_t i = 0; i < items.size(); ++i) {
    const std::uint64_t b = items[i].bytes();
    if (in_shard > 0 && in_shard + b > shard_limit) {
      shards.emplace_back();
      in_shard = 0;
    }
    shards.back().push_back(i);
    in_shard += b;
    total += b;
  }

  PartialOutput written(dst, prepare_output_dir(dst));
  std::fprintf(stderr, "quantize: %s -> %s, %s%s, %zu matrices quantized, %zu shard%s, %.1f MiB\n", src.c_str(),
               dst.c_str(), dg::io::quant_scheme_name(spec.scheme),
               spec.group_size > 0 ? (" group " + std::to_string(spec.group_size)).c_str() : " per channel",
               quantized_count, shards.size(), shards.size() == 1 ? "" : "s", total / 1048576.0);

  const auto start = std::chrono::steady_clock::now();
  nlohmann::ordered_json weight_map = nlohmann::ordered_json::object();
  std::uint64_t done = 0;
  int reported = 0;  // twentieths of the bytes reported so far
  std::vector<float> rows;
  char file[64];
  for (std::size_t s = 0; s < shards.size(); ++s) {
    std::snprintf(file, sizeof file, "model-%05zu-of-%05zu.safetensors", s + 1, shards.size());
    std::vector<dg::io::TensorSpec> specs;
    for (std::size_t i : shards[s]) {
      for (const auto& t : items[i].outputs) {
        specs.push_back(t);
        weight_map[t.name] = file;
      }
    }
    dg::io::SafetensorsStream out(written.add(file), specs);
    for (std::size_t i : shards[s]) {
      const OutputTensor& it = items[i];
      const dg::RawTensor& t = *it.source;
      if (!it.quantize) {
        // In pieces, releasing each: a 1.4 GiB embedding never becomes resident all at once.
        constexpr std::size_t kPiece = std::size_t{64} << 20;
        for (std::size_t off = 0; off < t.nbytes; off += kPiece) {
          const std::size_t n = std::min(kPiece, t.nbytes - off);
          out.append(t.data + off, n);
          release(t.data + off, n);
        }
      } else {
        const std::int64_t n = it.rows * it.cols;
        rows.resize(static_cast<std::size_t>(n));
        const std::int64_t first = it.row0 * it.cols;
        widen(t, first, n, rows.data());
        std::vector<dg::io::QuantizedTensor> quantized;
        try {
          quantized = dg::io::quantize_matrix(rows.data(), it.rows, it.cols, spec_of(it));
        } catch (const dg::Error& e) {
          // Rows are counted within the module; a fused expert tensor's module starts at row0.
          std::string where = it.module + " (" + it.source_name;
          if (it.source_name != it.module + ".weight") where += " from row " + std::to_string(it.row0);
          throw dg::Error(e.code(), where + ", " + ckpt.file_of(it.source_name) + "): " + e.what() +
                                        "; nothing was kept in " + dst);
        }
        for (const auto& q : quantized) out.append(q.bytes.data(), q.bytes.size());
        release(t.data + first * static_cast<std::int64_t>(dg::dtype_size(t.dtype)),
                static_cast<std::size_t>(n) * dg::dtype_size(t.dtype));
      }
      done += it.bytes();
      // Every 5 %, floored, so "100%" is printed once, after the last tensor.
      const int twentieths = total > 0 ? static_cast<int>(done * 20 / total) : 20;
      if (twentieths > reported) {
        reported = twentieths;
        const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
        std::fprintf(stderr, "quantize: %3d%%  %.1f/%.1f MiB written, %.1f s  (%s)\n", twentieths * 5,
                     done / 1048576.0, total / 1048576.0, secs, it.module.c_str());
      }
    }
    out.finish();
  }

  nlohmann::ordered_json index;
  index["metadata"] = {{"total_size", total}};
  index["weight_map"] = weight_map;
  write_text(written.add("model.safetensors.index.json"), index.dump(2) + "\n");

  // Everything else beside the weights (generation config, tokenizer, chat template) comes along;
  // config.json last, so that a directory without it was never a whole checkpoint.
  if (DIR* d = ::opendir(src.c_str())) {
    while (const dirent* e = ::readdir(d)) {
      const std::string n = e->d_name;
      struct stat st {};
      if (::stat((src + "/" + n).c_str(), &st) != 0 || !S_ISREG(st.st_mode)) continue;
      const bool weights = n.size() > 12 && n.compare(n.size() - 12, 12, ".safetensors") == 0;
      if (weights || n == "config.json" || n == "model.safetensors.index.json") continue;
      try {
        copy_file(src + "/" + n, written.add(n));
      } catch (...) {
        ::closedir(d);
        throw;
      }
    }
    ::closedir(d);
  }
  nlohmann::ordered_json config = nlohmann::ordered_json::parse(dg::io::read_text_file(src + "/config.json"));
  config["quantization_config"] = spec.config_json(dg::io::default_ignore());
  write_text(written.add("config.json"), config.dump(2) + "\n");
  written.keep();
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::fprintf(stderr, "quantize: wrote %s (%.1f MiB in %zu shard%s) in %.1f s\n", dst.c_str(), total / 1048576.0,
               shards.size(), shards.size() == 1 ? "" : "s", secs);
  return 0;
}

int cmd_dequantize(const std::vector<std::string>& args) {
  Flags f("dequantize",
          "Writes every quantized matrix of a checkpoint, dequantised as this library computes with it, to\n"
          "one safetensors file of F32 tensors named <module>.weight (for comparing with other tools:\n"
          "tools/reference/check_quantized_readback.py). Holds the output in memory: for small checkpoints.",
          {{"model", "DIR", "quantized checkpoint directory"}, {"out", "FILE", "output .safetensors"}});
  if (!f.parse(args)) {
    std::cout << f.usage();
    return 0;
  }
  refuse_overwriting_checkpoint("out", f.required("out"), f.required("model"));
  const dg::io::LoadedCheckpoint c = dg::io::load_checkpoint(f.required("model"));
  if (!c.quantization.quantized()) {
    throw dg::Error(dg::StatusCode::kInvalidArgument, f.str("model") + ": the checkpoint is not quantized (config.json "
                    "has no quantization_config): nothing to dequantize");
  }
  const std::string out_path = f.required("out");
  dg::io::SafetensorsWriter out;
  std::size_t count = 0;
  std::function<void(const dg::Weight&)> visit = [&](const dg::Weight& w) {
    if (w.is_split()) {
      for (const dg::Weight& p : *w.parts) visit(p);
      return;
    }
    if (!w.is_quantized()) return;
    const dg::QuantizedMatrix& q = *w.quant;
    std::vector<std::byte> buf(static_cast<std::size_t>(q.rows * q.cols) * dg::dtype_size(q.scale_dtype()));
    dg::cpu::kernels::dequantize_rows(q, 0, q.rows, buf.data());
    dg::RawTensor t;
    t.data = buf.data();
    t.dtype = q.scale_dtype();
    t.shape = dg::Shape{q.rows, q.cols};
    std::vector<float> values(static_cast<std::size_t>(q.rows * q.cols));
    for (std::size_t i = 0; i < values.size(); ++i) values[i] = dg::load_as_float(t, static_cast<std::int64_t>(i));
    out.add(q.module + ".weight", t.shape, values.data());
    ++count;
  };
  dg::for_each_parameter(c.config, c.weights, [&](const dg::ParamSpec&, const dg::Weight& w) { visit(w); });
  out.write(out_path);
  std::fprintf(stderr, "dequantize: wrote %zu matrices to %s\n", count, out_path.c_str());
  return 0;
}

}  // namespace dgemma
