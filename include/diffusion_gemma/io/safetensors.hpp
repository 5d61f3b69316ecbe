// SPDX-License-Identifier: Apache-2.0
// Reader for the safetensors format: one file, or a sharded checkpoint described by
// model.safetensors.index.json. Tensors are zero-copy views into read-only memory maps.
//
// Every structural property is checked before a view is handed out (header length, UTF-8,
// JSON shape, dtype, shape, offsets inside the data section, size = numel x element size, tensors
// covering the data section exactly, no duplicate names), so a corrupt or hostile file yields an
// Error naming the file and tensor, never an out-of-bounds read. A directory with both
// model.safetensors and an index is read from model.safetensors, as transformers reads it.
#pragma once

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <limits>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include <sys/stat.h>

#include <nlohmann/json.hpp>

#include <diffusion_gemma/core/status.hpp>
#include <diffusion_gemma/core/tensor_view.hpp>
#include <diffusion_gemma/io/json_file.hpp>
#include <diffusion_gemma/io/mapped_file.hpp>
#include <diffusion_gemma/io/utf8.hpp>

namespace diffusion_gemma::io {

// Headers of real checkpoints are a few hundred KiB; anything this large is corrupt.
inline constexpr std::uint64_t kMaxSafetensorsHeaderBytes = 100ull << 20;

struct SafetensorsEntry {
  std::string name;
  RawTensor tensor;
  std::uint64_t begin = 0;  // offsets inside the data section
  std::uint64_t end = 0;
};

namespace detail {

inline std::uint64_t read_le_u64(const std::byte* p) {
  std::uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | static_cast<std::uint8_t>(p[i]);
  return v;
}

// Parses a safetensors header held in memory. `data` points at the first byte after the header,
// and `data_size` bytes follow it. `where` names the file in messages.
inline std::vector<SafetensorsEntry> parse_safetensors_header(std::string_view header, const std::byte* data,
                                                              std::uint64_t data_size, const std::string& where,
                                                              std::map<std::string, std::string>* metadata) {
  using nlohmann::json;
  const std::size_t bad = find_invalid_utf8(header);
  if (bad != std::string_view::npos) {
    throw_error(StatusCode::kFormatError, where, ": safetensors header is not valid UTF-8 (byte ", bad,
                " of the header)");
  }
  const std::size_t nul = find_nul(header);
  if (nul != std::string_view::npos) {
    throw_error(StatusCode::kFormatError, where, ": safetensors header is not valid JSON: a NUL byte at offset ", nul,
                " of the header");
  }
  // JSON parsers keep the last of duplicate keys, so a name or a field given twice would pick one
  // of two meanings silently (safetensors' own reader refuses a field given twice).
  std::set<std::string> seen, fields;
  std::string tensor, duplicate, duplicate_field;
  json root;
  try {
    root = json::parse(header, [&](int depth, json::parse_event_t event, json& parsed) {
      if (event != json::parse_event_t::key) return true;
      const auto key = parsed.get<std::string>();
      if (depth == 1) {
        tensor = key;
        fields.clear();
        if (!seen.insert(key).second && duplicate.empty()) duplicate = key;
      } else if (depth == 2 && tensor != "__metadata__" && !fields.insert(key).second && duplicate_field.empty()) {
        duplicate_field = tensor + "'s field '" + key;
      }
      return true;
    });
  } catch (const json::exception& e) {
    throw_error(StatusCode::kFormatError, where, ": safetensors header is not valid JSON: ", e.what());
  }
  if (!duplicate.empty()) {
    throw_error(StatusCode::kFormatError, where, ": tensor '", duplicate, "' appears twice in the header");
  }
  if (!duplicate_field.empty()) {
    throw_error(StatusCode::kFormatError, where, ": tensor '", duplicate_field, "' appears twice in the header");
  }
  if (!root.is_object()) {
    throw_error(StatusCode::kFormatError, where, ": safetensors header must be a JSON object");
  }
  std::vector<SafetensorsEntry> entries;
  entries.reserve(root.size());
  for (auto it = root.begin(); it != root.end(); ++it) {
    const std::string& name = it.key();
    const json& value = it.value();
    if (name == "__metadata__") {
      if (value.is_null()) continue;  // no metadata, as the safetensors package reads it
      if (!value.is_object()) throw_error(StatusCode::kFormatError, where, ": __metadata__ must be an object");
      for (auto m = value.begin(); m != value.end(); ++m) {
        if (!m.value().is_string()) {
          throw_error(StatusCode::kFormatError, where, ": __metadata__ value '", m.key(), "' must be a string");
        }
        if (metadata != nullptr) (*metadata)[m.key()] = m.value().get<std::string>();
      }
      continue;
    }
    const std::string at = where + ": tensor '" + name + "'";
    if (!value.is_object()) throw_error(StatusCode::kFormatError, at, " must be described by an object");
    const auto dt = value.find("dtype");
    const auto sh = value.find("shape");
    const auto off = value.find("data_offsets");
    if (dt == value.end() || !dt->is_string()) throw_error(StatusCode::kFormatError, at, " has no string 'dtype'");
    if (sh == value.end() || !sh->is_array()) throw_error(StatusCode::kFormatError, at, " has no array 'shape'");
    if (off == value.end() || !off->is_array() || off->size() != 2) {
      throw_error(StatusCode::kFormatError, at, " needs 'data_offsets' as [begin, end]");
    }
    SafetensorsEntry e;
    e.name = name;
    const std::string dtype_str = dt->get<std::string>();
    if (!parse_dtype(dtype_str, &e.tensor.dtype)) {
      if (is_known_unsupported_dtype(dtype_str)) {
        throw_error(StatusCode::kUnsupported, at, " has dtype ", dtype_str,
                    ", which this library does not read (F32, F16, BF16, I32, I64, U8, BOOL, I8, F8_E4M3)");
      }
      throw_error(StatusCode::kFormatError, at, " has unknown dtype '", dtype_str, "'");
    }
    if (sh->size() > static_cast<std::size_t>(Shape::kMaxRank)) {
      throw_error(StatusCode::kUnsupported, at, " has rank ", sh->size(), "; at most ", Shape::kMaxRank,
                  " is supported");
    }
    std::uint64_t numel = 1;
    bool overflow = false;
    for (const auto& d : *sh) {
      if (!d.is_number_integer() || (d.is_number_integer() && !d.is_number_unsigned() && d.get<std::int64_t>() < 0)) {
        throw_error(StatusCode::kFormatError, at, " has shape ", sh->dump(),
                    ": dimensions must be non-negative integers");
      }
      const std::uint64_t v = d.get<std::uint64_t>();
      if (v > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max())) overflow = true;
      if (v != 0 && numel > std::numeric_limits<std::uint64_t>::max() / v) overflow = true;
      numel *= v;
      e.tensor.shape.dims[e.tensor.shape.rank++] = static_cast<std::int64_t>(v);
    }
    const std::uint64_t elem = dtype_size(e.tensor.dtype);
    if (overflow || numel > std::numeric_limits<std::uint64_t>::max() / elem) {
      throw_error(StatusCode::kFormatError, at, " has shape ", sh->dump(), " whose size overflows");
    }
    for (const auto& o : *off) {
      if (!o.is_number_unsigned()) {
        throw_error(StatusCode::kFormatError, at, " has data_offsets ", off->dump(),
                    ": offsets must be non-negative integers");
      }
    }
    e.begin = (*off)[0].get<std::uint64_t>();
    e.end = (*off)[1].get<std::uint64_t>();
    if (e.begin > e.end) {
      throw_error(StatusCode::kFormatError, at, " has data_offsets [", e.begin, ", ", e.end, "] with begin > end");
    }
    if (e.end > data_size) {
      throw_error(StatusCode::kFormatError, at, " has data_offsets [", e.begin, ", ", e.end,
                  "] beyond the data section of ", data_size, " bytes (file truncated?)");
    }
    if (e.end - e.begin != numel * elem) {
      throw_error(StatusCode::kFormatError, at, " occupies ", e.end - e.begin, " bytes but shape ",
                  e.tensor.shape.str(), " x ", dtype_str, " needs ", numel * elem);
    }
    e.tensor.data = data + e.begin;
    e.tensor.nbytes = static_cast<std::size_t>(e.end - e.begin);
    entries.push_back(std::move(e));
  }
  // The format (and the `safetensors` package, which refuses anything else) requires the tensors,
  // in offset order, to cover the data section exactly: no overlap, no hole, nothing after the
  // last one. Bytes no tensor accounts for are how a file hides other content.
  std::vector<const SafetensorsEntry*> by_offset;
  by_offset.reserve(entries.size());
  for (const auto& e : entries) by_offset.push_back(&e);
  std::sort(by_offset.begin(), by_offset.end(), [](const SafetensorsEntry* a, const SafetensorsEntry* b) {
    return a->begin != b->begin ? a->begin < b->begin : a->end < b->end;
  });
  std::uint64_t covered = 0;
  const SafetensorsEntry* prev = nullptr;
  for (const SafetensorsEntry* e : by_offset) {
    if (e->begin < covered) {
      throw_error(StatusCode::kFormatError, where, ": tensors '", prev->name, "' and '", e->name,
                  "' overlap in the data section");
    }
    if (e->begin > covered) {
      throw_error(StatusCode::kFormatError, where, ": bytes [", covered, ", ", e->begin, ") of the data section before tensor '",
                  e->name, "' belong to no tensor");
    }
    covered = e->end;
    prev = e;
  }
  if (covered != data_size) {
    throw_error(StatusCode::kFormatError, where, ": the data section has ", data_size, " bytes but its tensors end at ",
                covered, " (trailing bytes belong to no tensor)");
  }
  return entries;
}

}  // namespace detail

namespace detail {

// Parses a whole safetensors image held in memory (`size` bytes at `bytes`); the returned views
// point into it. SafetensorsFile uses it on a memory map; the fuzzer on raw input.
inline std::vector<SafetensorsEntry> parse_safetensors(const std::byte* bytes, std::size_t size, const std::string& where,
                                                       std::map<std::string, std::string>* metadata) {
  if (size < 8) {
    throw_error(StatusCode::kFormatError, where, ": ", size == 0 ? "empty file" : "truncated file", " (", size,
                " bytes): a safetensors file starts with an 8-byte header length");
  }
  const std::uint64_t header_len = read_le_u64(bytes);
  if (header_len > kMaxSafetensorsHeaderBytes) {
    throw_error(StatusCode::kFormatError, where, ": header length ", header_len, " bytes is implausibly large (limit ",
                kMaxSafetensorsHeaderBytes, ")");
  }
  if (header_len > size - 8) {
    throw_error(StatusCode::kFormatError, where, ": header length ", header_len, " exceeds the ", size - 8,
                " bytes that follow it (file truncated?)");
  }
  const std::string_view header(reinterpret_cast<const char*>(bytes + 8), header_len);
  return parse_safetensors_header(header, bytes + 8 + header_len, size - 8 - header_len, where, metadata);
}

}  // namespace detail

// One .safetensors file, mapped.
class SafetensorsFile {
 public:
  explicit SafetensorsFile(const std::string& path) : file_(path) {
    entries_ = detail::parse_safetensors(file_.data(), file_.size(), path, &metadata_);
    for (std::size_t i = 0; i < entries_.size(); ++i) index_[entries_[i].name] = i;
  }

  const std::string& path() const { return file_.path(); }
  const std::vector<SafetensorsEntry>& entries() const { return entries_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  const SafetensorsEntry* find(const std::string& name) const {
    const auto it = index_.find(name);
    return it == index_.end() ? nullptr : &entries_[it->second];
  }
  // The tensor, or an Error naming the file and the missing tensor.
  const RawTensor& at(const std::string& name) const {
    const auto* e = find(name);
    if (e == nullptr) throw_error(StatusCode::kNotFound, path(), ": no tensor named '", name, "'");
    return e->tensor;
  }

 private:
  MappedFile file_;
  std::vector<SafetensorsEntry> entries_;
  std::map<std::string, std::size_t> index_;
  std::map<std::string, std::string> metadata_;
};

// A checkpoint directory: model.safetensors, or shards listed by model.safetensors.index.json.
class Checkpoint {
 public:
  static constexpr const char* kIndexName = "model.safetensors.index.json";
  static constexpr const char* kSingleName = "model.safetensors";

  // As transformers: model.safetensors when it exists, even beside an index, else the index.
  explicit Checkpoint(const std::string& dir) : dir_(dir) {
    const std::string single = dir + "/" + kSingleName;
    const std::string index_path = dir + "/" + kIndexName;
    if (::access(single.c_str(), F_OK) == 0) {
      add_shard(single);
    } else if (::access(index_path.c_str(), F_OK) == 0) {
      load_index(index_path);
    } else {
      // A model downloaded into the Hugging Face cache holds links into blobs/; one whose blob is
      // gone is named as such, not as a missing file.
      for (const std::string& path : {single, index_path}) {
        struct stat st {};
        if (::lstat(path.c_str(), &st) == 0 && S_ISLNK(st.st_mode) && ::stat(path.c_str(), &st) != 0) {
          throw_error(StatusCode::kNotFound, path, " is a symbolic link whose target cannot be read (",
                      std::strerror(errno), ")");
        }
      }
      throw_error(StatusCode::kNotFound, dir, ": neither ", kSingleName, " nor ", kIndexName, " exists");
    }
  }

  const std::string& dir() const { return dir_; }
  std::vector<std::string> names() const {
    std::vector<std::string> out;
    out.reserve(where_.size());
    for (const auto& kv : where_) out.push_back(kv.first);
    return out;
  }
  bool contains(const std::string& name) const { return where_.count(name) != 0; }
  const SafetensorsEntry* find(const std::string& name) const {
    const auto it = where_.find(name);
    return it == where_.end() ? nullptr : shards_[it->second]->find(name);
  }
  // The file that holds `name` (for messages).
  const std::string& file_of(const std::string& name) const {
    const auto it = where_.find(name);
    return it == where_.end() ? dir_ : shards_[it->second]->path();
  }
  std::size_t num_shards() const { return shards_.size(); }

 private:
  void load_index(const std::string& index_path) {
    using nlohmann::json;
    MappedFile f(index_path);
    const std::string_view text(reinterpret_cast<const char*>(f.data()), f.size());
    const json root = parse_json_text(text, index_path);
    if (!root.is_object() || !root.contains("weight_map") || !root["weight_map"].is_object()) {
      throw_error(StatusCode::kFormatError, index_path, ": needs an object 'weight_map'");
    }
    std::map<std::string, std::size_t> shard_of_file;
    std::map<std::string, std::string> expected;  // tensor -> shard file
    for (auto it = root["weight_map"].begin(); it != root["weight_map"].end(); ++it) {
      if (!it.value().is_string()) {
        throw_error(StatusCode::kFormatError, index_path, ": weight_map['", it.key(), "'] must be a file name");
      }
      const std::string file = it.value().get<std::string>();
      // A NUL would cut the path short at open() and name another file than the index says.
      if (file.empty() || file.find_first_of(std::string("/\0", 2)) != std::string::npos || file == "." || file == "..") {
        // dump(): the name as JSON spells it, so that a NUL is shown instead of ending the message.
        throw_error(StatusCode::kFormatError, index_path, ": weight_map['", it.key(), "'] = ", it.value().dump(),
                    " must be a file name inside the checkpoint directory");
      }
      expected[it.key()] = file;
      if (shard_of_file.count(file) == 0) {
        const std::string path = dir_ + "/" + file;
        if (::access(path.c_str(), F_OK) != 0) {
          throw_error(StatusCode::kNotFound, index_path, " names shard '", file, "' (for tensor '", it.key(),
                      "'), which does not exist");
        }
        shard_of_file[file] = shards_.size();
        add_shard(path);
      }
    }
    for (const auto& kv : expected) {
      const auto it = where_.find(kv.first);
      if (it == where_.end() || shards_[it->second]->path() != dir_ + "/" + kv.second) {
        throw_error(StatusCode::kFormatError, index_path, ": tensor '", kv.first, "' is mapped to '", kv.second,
                    "' but that shard does not contain it");
      }
    }
  }

  void add_shard(const std::string& path) {
    shards_.push_back(std::make_unique<SafetensorsFile>(path));
    const std::size_t idx = shards_.size() - 1;
    for (const auto& e : shards_[idx]->entries()) {
      const auto ins = where_.emplace(e.name, idx);
      if (!ins.second) {
        throw_error(StatusCode::kFormatError, path, ": tensor '", e.name, "' is also in ",
                    shards_[ins.first->second]->path());
      }
    }
  }

  std::string dir_;
  std::vector<std::unique_ptr<SafetensorsFile>> shards_;
  std::map<std::string, std::size_t> where_;
};

}  // namespace diffusion_gemma::io
