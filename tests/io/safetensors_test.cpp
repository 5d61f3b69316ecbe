// SPDX-License-Identifier: Apache-2.0
#include <cstdint>
#include <fstream>
#include <string>
#include <vector>

#include <sys/stat.h>
#include <unistd.h>

#include <diffusion_gemma/io/safetensors.hpp>
#include <diffusion_gemma/io/safetensors_writer.hpp>

#include "support/catch.hpp"
#include "support/paths.hpp"

using namespace diffusion_gemma;
using Catch::Matchers::Contains;

namespace {

std::string dir() {
  static const std::string d = dg_test::temp_dir("safetensors");
  return d;
}

void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream f(path, std::ios::binary);
  f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

// A safetensors file with the given header text and `data_bytes` zero bytes of data.
std::string make_file(const std::string& name, const std::string& header, std::size_t data_bytes,
                      std::uint64_t declared_len = UINT64_MAX) {
  std::string out(8, '\0');
  const std::uint64_t n = declared_len == UINT64_MAX ? header.size() : declared_len;
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((n >> (8 * i)) & 0xff);
  out += header;
  out += std::string(data_bytes, '\0');
  const std::string path = dir() + "/" + name;
  write_bytes(path, out);
  return path;
}

std::string error_of(const std::string& path) {
  try {
    io::SafetensorsFile f(path);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST_CASE("safetensors round trip through the writer", "[io][safetensors]") {
  io::SafetensorsWriter w;
  const std::vector<float> a{1.0f, 2.0f, 3.0f, 4.0f, 5.0f, 6.0f};
  const std::vector<std::int64_t> ids{7, -1, 262143};
  const std::vector<bfloat16> b{bfloat16::from_float(1.5f), bfloat16::from_float(-2.0f)};
  w.add("a", {2, 3}, a.data());
  w.add("ids", {3}, ids.data());
  w.add("b", {2}, b.data());
  w.add("empty", {0, 4}, a.data());
  w.set_metadata("format", "pt");
  const std::string path = dir() + "/roundtrip.safetensors";
  w.write(path);

  io::SafetensorsFile f(path);
  CHECK(f.entries().size() == 4);
  CHECK(f.metadata().at("format") == "pt");
  const RawTensor& ta = f.at("a");
  CHECK(ta.dtype == DType::kF32);
  CHECK(ta.shape == Shape{2, 3});
  for (int i = 0; i < 6; ++i) CHECK(load_as_float(ta, i) == a[i]);
  CHECK(load_as_float(f.at("b"), 1) == -2.0f);
  CHECK(f.at("ids").as<std::int64_t>()(2) == 262143);
  CHECK(f.at("empty").nbytes == 0);
  CHECK_THROWS_WITH(f.at("nope"), Contains("no tensor named 'nope'"));
}

TEST_CASE("safetensors rejects malformed files with a message naming the file and tensor", "[io][safetensors]") {
  SECTION("empty file") {
    const std::string p = dir() + "/empty.safetensors";
    write_bytes(p, "");
    CHECK_THAT(error_of(p), Contains("empty.safetensors") && Contains("empty file"));
  }
  SECTION("truncated before the header length") {
    const std::string p = dir() + "/short.safetensors";
    write_bytes(p, "abc");
    CHECK_THAT(error_of(p), Contains("truncated"));
  }
  SECTION("header length larger than the file") {
    const auto p = make_file("hlen.safetensors", "{}", 0, 1000);
    CHECK_THAT(error_of(p), Contains("header length 1000 exceeds"));
  }
  SECTION("absurd header length") {
    const auto p = make_file("huge.safetensors", "{}", 0, 1ull << 62);
    CHECK_THAT(error_of(p), Contains("implausibly large"));
  }
  SECTION("header is not JSON") {
    const auto p = make_file("notjson.safetensors", "{not json", 0);
    CHECK_THAT(error_of(p), Contains("not valid JSON"));
  }
  SECTION("header is not UTF-8") {
    const auto p = make_file("utf8.safetensors", std::string("{\"a\xff\": 1}"), 0);
    CHECK_THAT(error_of(p), Contains("not valid UTF-8"));
  }
  SECTION("a NUL byte in the header (the JSON parser would stop there and drop the rest)") {
    const auto p = make_file("nul.safetensors", std::string("{}\0{\"w\": 1}", 11), 0);
    CHECK_THAT(error_of(p), Contains("nul.safetensors") && Contains("a NUL byte at offset 2"));
  }
  SECTION("a FIFO in place of the file is refused, not waited on") {
    const std::string p = dir() + "/fifo.safetensors";
    ::unlink(p.c_str());
    REQUIRE(::mkfifo(p.c_str(), 0600) == 0);
    CHECK_THAT(error_of(p), Contains("fifo.safetensors") && Contains("not a regular file"));
    ::unlink(p.c_str());
  }
  SECTION("header is not an object") {
    const auto p = make_file("array.safetensors", "[1,2]", 0);
    CHECK_THAT(error_of(p), Contains("must be a JSON object"));
  }
  SECTION("offsets beyond the data section") {
    const auto p = make_file("beyond.safetensors", R"({"w":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})", 8);
    CHECK_THAT(error_of(p), Contains("tensor 'w'") && Contains("beyond the data section"));
  }
  SECTION("begin after end") {
    const auto p = make_file("order.safetensors", R"({"w":{"dtype":"F32","shape":[0],"data_offsets":[8,4]}})", 8);
    CHECK_THAT(error_of(p), Contains("begin > end"));
  }
  SECTION("overlapping tensors") {
    const auto p = make_file("overlap.safetensors",
                             R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                             R"("b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
                             12);
    CHECK_THAT(error_of(p), Contains("overlap"));
  }
  // The data section must be covered exactly, as the safetensors package requires: it refuses
  // each of these three with "invalid offset" / "file not fully covered".
  SECTION("bytes between two tensors that belong to neither") {
    const auto p = make_file("hole.safetensors",
                             R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
                             R"("b":{"dtype":"F32","shape":[1],"data_offsets":[8,12]}})",
                             12);
    CHECK_THAT(error_of(p), Contains("hole.safetensors") && Contains("bytes [4, 8)") && Contains("belong to no tensor"));
  }
  SECTION("trailing bytes after the last tensor") {
    const auto p = make_file("trailing.safetensors", R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})", 8);
    CHECK_THAT(error_of(p), Contains("trailing.safetensors") && Contains("8 bytes but its tensors end at 4"));
  }
  SECTION("a zero-size tensor inside another") {
    const auto p = make_file("zero_inside.safetensors",
                             R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                             R"("z":{"dtype":"F32","shape":[0],"data_offsets":[4,4]}})",
                             8);
    CHECK_THAT(error_of(p), Contains("overlap"));
  }
  SECTION("zero-size tensors at either end are fine") {
    const auto p = make_file("zero_ends.safetensors",
                             R"({"z0":{"dtype":"F32","shape":[0],"data_offsets":[0,0]},)"
                             R"("a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
                             R"("z1":{"dtype":"F32","shape":[0],"data_offsets":[4,4]}})",
                             4);
    CHECK(error_of(p).empty());
  }
  SECTION("size disagrees with shape x dtype") {
    const auto p = make_file("size.safetensors", R"({"w":{"dtype":"BF16","shape":[3],"data_offsets":[0,8]}})", 8);
    CHECK_THAT(error_of(p), Contains("tensor 'w'") && Contains("needs 6"));
  }
  SECTION("unknown dtype") {
    const auto p = make_file("dtype.safetensors", R"({"w":{"dtype":"Q4","shape":[1],"data_offsets":[0,1]}})", 1);
    CHECK_THAT(error_of(p), Contains("unknown dtype 'Q4'"));
  }
  SECTION("known but unsupported dtype") {
    const auto p = make_file("f64.safetensors", R"({"w":{"dtype":"F64","shape":[1],"data_offsets":[0,8]}})", 8);
    CHECK_THAT(error_of(p), Contains("F64") && Contains("does not read"));
  }
  SECTION("negative shape") {
    const auto p = make_file("neg.safetensors", R"({"w":{"dtype":"F32","shape":[-1],"data_offsets":[0,0]}})", 0);
    CHECK_THAT(error_of(p), Contains("non-negative integers"));
  }
  SECTION("non-integer shape") {
    const auto p = make_file("frac.safetensors", R"({"w":{"dtype":"F32","shape":[1.5],"data_offsets":[0,4]}})", 4);
    CHECK_THAT(error_of(p), Contains("non-negative integers"));
  }
  SECTION("shape whose size overflows") {
    const auto p = make_file(
        "ovf.safetensors",
        R"({"w":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,4]}})", 4);
    CHECK_THAT(error_of(p), Contains("overflows"));
  }
  SECTION("duplicate names") {
    const auto p = make_file("dup.safetensors",
                             R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
                             R"("w":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})",
                             8);
    CHECK_THAT(error_of(p), Contains("'w' appears twice"));
  }
  SECTION("a field given twice in one entry") {
    const auto p = make_file("dupfield.safetensors",
                             R"({"__metadata__":{"format":"pt"},"v":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
                             R"("w":{"dtype":"F32","shape":[1],"dtype":"BF16","data_offsets":[4,8]}})",
                             8);
    CHECK_THAT(error_of(p), Contains("tensor 'w's field 'dtype' appears twice"));
  }
  SECTION("a null __metadata__ is no metadata, as the safetensors package reads it") {
    const auto p = make_file("nullmeta.safetensors",
                             R"({"__metadata__":null,"w":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})", 4);
    CHECK(error_of(p).empty());
  }
  SECTION("missing data_offsets") {
    const auto p = make_file("nooff.safetensors", R"({"w":{"dtype":"F32","shape":[1]}})", 4);
    CHECK_THAT(error_of(p), Contains("data_offsets"));
  }
  SECTION("missing file") {
    CHECK_THAT(error_of(dir() + "/does_not_exist.safetensors"), Contains("cannot open"));
  }
}

TEST_CASE("sharded checkpoints resolve tensors through the index", "[io][safetensors]") {
  const std::string d = dg_test::temp_dir("sharded");
  const std::vector<float> x{1, 2, 3}, y{4, 5};
  io::SafetensorsWriter s1, s2;
  s1.add("x", {3}, x.data());
  s2.add("y", {2}, y.data());
  s1.write(d + "/model-00001-of-00002.safetensors");
  s2.write(d + "/model-00002-of-00002.safetensors");
  write_bytes(d + "/model.safetensors.index.json",
              R"({"metadata":{},"weight_map":{"x":"model-00001-of-00002.safetensors","y":"model-00002-of-00002.safetensors"}})");
  io::Checkpoint c(d);
  CHECK(c.num_shards() == 2);
  REQUIRE(c.find("y") != nullptr);
  CHECK(load_as_float(c.find("y")->tensor, 1) == 5.0f);
  CHECK_THAT(c.file_of("x"), Contains("model-00001"));

  SECTION("an index naming a missing shard") {
    const std::string bad = dg_test::temp_dir("sharded_missing");
    s1.write(bad + "/a.safetensors");
    write_bytes(bad + "/model.safetensors.index.json", R"({"weight_map":{"x":"a.safetensors","y":"b.safetensors"}})");
    CHECK_THROWS_WITH(io::Checkpoint(bad), Contains("names shard 'b.safetensors'") && Contains("does not exist"));
  }
  SECTION("an index mapping a tensor to the wrong shard") {
    const std::string bad = dg_test::temp_dir("sharded_wrong");
    s1.write(bad + "/a.safetensors");
    s2.write(bad + "/b.safetensors");
    write_bytes(bad + "/model.safetensors.index.json", R"({"weight_map":{"x":"b.safetensors","y":"a.safetensors"}})");
    CHECK_THROWS_WITH(io::Checkpoint(bad), Contains("does not contain it"));
  }
  SECTION("an index escaping the directory") {
    const std::string bad = dg_test::temp_dir("sharded_escape");
    write_bytes(bad + "/model.safetensors.index.json", R"({"weight_map":{"x":"../etc/passwd"}})");
    CHECK_THROWS_WITH(io::Checkpoint(bad), Contains("must be a file name inside"));
  }
  SECTION("a shard name with a NUL in it (open() would read the name cut at the NUL)") {
    const std::string bad = dg_test::temp_dir("sharded_nul");
    s1.write(bad + "/a.safetensors");
    write_bytes(bad + "/model.safetensors.index.json", R"({"weight_map":{"x":"a.safetensors\u0000.bin"}})");
    CHECK_THROWS_WITH(io::Checkpoint(bad), Contains("= \"a.safetensors\\u0000.bin\" must be a file name inside"));
  }
  SECTION("a link whose target is gone, as in a Hugging Face cache without its blob") {
    const std::string cache = dg_test::temp_dir("dangling_blob");
    ::unlink((cache + "/model.safetensors").c_str());
    REQUIRE(::symlink("../blobs/0123abcd", (cache + "/model.safetensors").c_str()) == 0);
    CHECK_THROWS_WITH(io::Checkpoint(cache),
                      Contains("model.safetensors is a symbolic link whose target cannot be read (No such file"));
  }
  SECTION("model.safetensors beside an index is what transformers reads, so it is what is read") {
    const std::string both = dg_test::temp_dir("sharded_and_single");
    s1.write(both + "/model-00001-of-00002.safetensors");
    s2.write(both + "/model-00002-of-00002.safetensors");
    write_bytes(both + "/model.safetensors.index.json",
                R"({"weight_map":{"x":"model-00001-of-00002.safetensors","y":"model-00002-of-00002.safetensors"}})");
    io::SafetensorsWriter single;
    const std::vector<float> z{7};
    single.add("z", {1}, z.data());
    single.write(both + "/model.safetensors");
    const io::Checkpoint cb(both);
    CHECK(cb.num_shards() == 1);
    CHECK(cb.names() == std::vector<std::string>{"z"});
  }
  SECTION("no checkpoint at all") {
    CHECK_THROWS_WITH(io::Checkpoint(dg_test::temp_dir("nothing")), Contains("neither model.safetensors"));
  }
}
