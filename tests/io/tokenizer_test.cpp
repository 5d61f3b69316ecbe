// SPDX-License-Identifier: Apache-2.0
// Exactness of the tokenizer against Python `tokenizers` (golden outputs from
// tools/reference/make_tokenizer_fixtures.py), and the errors for what it does not support.
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include <diffusion_gemma/io/tokenizer.hpp>

#include "support/catch.hpp"
#include "support/paths.hpp"

using namespace diffusion_gemma;
using Catch::Matchers::Contains;
using io::Json;
using io::Tokenizer;

namespace {

const Json& golden() {
  static const Json g = io::read_json_file(dg_test::fixture("tokenizers/golden.json"));
  return g;
}

std::string fixture_path(const std::string& file) { return dg_test::fixture("tokenizers/" + file); }

std::vector<int> ids_of(const Json& j) { return j.get<std::vector<int>>(); }

std::string from_hex(const std::string& hex) {
  std::string out;
  for (std::size_t i = 0; i + 1 < hex.size(); i += 2)
    out.push_back(static_cast<char>(std::stoi(hex.substr(i, 2), nullptr, 16)));
  return out;
}

// The encoder's input for corpus entry `c`: the raw bytes for the invalid-UTF-8 entries.
std::string input_of(const Json& c) {
  return c.contains("bytes_hex") ? from_hex(c.at("bytes_hex").get<std::string>()) : c.at("text").get<std::string>();
}

Json base_json(const std::string& file) { return io::read_json_file(fixture_path(file)); }

template <class F>
Error error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e;
  }
  return Error(StatusCode::kOk, "no error");
}

// Compares one tokenizer's encode/decode with a golden result row; returns the number of mismatching fields.
int compare(const Tokenizer& tok, const std::string& input, const Json& r) {
  int bad = 0;
  const std::vector<int> ids = ids_of(r.at("ids"));
  bad += tok.encode(input) != ids;
  bad += tok.encode(input, false) != ids_of(r.at("ids_no_special"));
  bad += tok.decode(ids) != r.at("decoded").get<std::string>();
  bad += tok.decode(ids, false) != r.at("decoded_keep").get<std::string>();
  return bad;
}

}  // namespace

TEST_CASE("golden: every fixture tokenizer matches Python tokenizers on the whole corpus", "[io][tokenizer]") {
  const Json& corpus = golden().at("corpus");
  REQUIRE(golden().at("tokenizers").size() == 4);
  for (const Json& t : golden().at("tokenizers")) {
    const std::string file = t.at("file").get<std::string>();
    const Tokenizer tok = Tokenizer::from_file(fixture_path(file));
    CHECK(tok.vocab_size() == t.at("vocab_size").get<int>());
    const Json& results = t.at("results");
    REQUIRE(results.size() == corpus.size());
    int mismatched_entries = 0;
    for (std::size_t i = 0; i < corpus.size(); ++i) {
      const std::string input = input_of(corpus[i]);
      const Json& r = results[i];
      INFO(file << " corpus[" << i << "] = " << corpus[i].dump());
      const std::vector<int> ids = ids_of(r.at("ids"));
      CHECK(tok.encode(input) == ids);
      CHECK(tok.encode(input, /*add_special_tokens=*/false) == ids_of(r.at("ids_no_special")));
      CHECK(tok.decode(ids) == r.at("decoded").get<std::string>());
      CHECK(tok.decode(ids, /*skip_special_tokens=*/false) == r.at("decoded_keep").get<std::string>());
      mismatched_entries += compare(tok, input, r) != 0;
    }
    INFO(file);
    CHECK(mismatched_entries == 0);

    for (const Json& d : t.at("decode")) {
      INFO(file << " decode case '" << d.at("name").get<std::string>() << "'");
      const std::vector<int> ids = ids_of(d.at("ids"));
      CHECK(tok.decode(ids) == d.at("decoded").get<std::string>());
      CHECK(tok.decode(ids, false) == d.at("decoded_keep").get<std::string>());
    }
  }
}

TEST_CASE("golden: component variants (Split behaviors, normalizer and decoder sequences, templates)",
          "[io][tokenizer]") {
  const Json& corpus = golden().at("corpus");
  REQUIRE(golden().at("variants").size() >= 10);
  for (const Json& v : golden().at("variants")) {
    const std::string name = v.at("name").get<std::string>();
    Json j = base_json(v.at("base").get<std::string>());
    for (auto it = v.at("override").begin(); it != v.at("override").end(); ++it) j[it.key()] = it.value();
    if (v.contains("model_patch")) {
      const Json& patch = v.at("model_patch");
      for (auto it = patch.at("vocab").begin(); it != patch.at("vocab").end(); ++it)
        j["model"]["vocab"][it.key()] = it.value();
      Json merges = patch.at("merges_prepend");
      for (const Json& m : j["model"]["merges"]) merges.push_back(m);
      j["model"]["merges"] = merges;
    }
    const Tokenizer tok = Tokenizer::from_json(j, name);
    const Json& indices = v.at("corpus_indices");
    const Json& results = v.at("results");
    REQUIRE(indices.size() == results.size());
    int mismatched_entries = 0;
    for (std::size_t k = 0; k < indices.size(); ++k) {
      const Json& c = corpus.at(indices[k].get<std::size_t>());
      INFO("variant '" << name << "' text " << c.dump());
      const std::vector<int> ids = ids_of(results[k].at("ids"));
      CHECK(tok.encode(input_of(c)) == ids);
      CHECK(tok.encode(input_of(c), false) == ids_of(results[k].at("ids_no_special")));
      CHECK(tok.decode(ids) == results[k].at("decoded").get<std::string>());
      CHECK(tok.decode(ids, false) == results[k].at("decoded_keep").get<std::string>());
      mismatched_entries += compare(tok, input_of(c), results[k]) != 0;
    }
    INFO("variant '" << name << "'");
    CHECK(mismatched_entries == 0);
  }
}

TEST_CASE("invalid UTF-8 is repaired exactly as Python's errors='replace' before encoding", "[io][tokenizer]") {
  int invalid = 0;
  for (const Json& c : golden().at("corpus")) {
    if (!c.contains("bytes_hex")) continue;
    ++invalid;
    const std::string raw = from_hex(c.at("bytes_hex").get<std::string>());
    INFO(c.dump());
    CHECK_FALSE(io::is_valid_utf8(raw));
    CHECK(io::tokenizer_detail::replace_invalid_utf8(raw) == c.at("text").get<std::string>());
  }
  CHECK(invalid >= 10);

  const Tokenizer tok = Tokenizer::from_file(fixture_path("gemma_bpe_1000.json"));
  // Same ids as encoding the repaired text; a lone bad byte is one U+FFFD, i.e. byte pieces EF BF BD.
  CHECK(tok.encode("a\xff") == tok.encode("a\xef\xbf\xbd"));
  const std::vector<int> ids = tok.encode("\xff", false);
  REQUIRE(ids.size() == 3);
  CHECK(tok.id_to_token(ids[0]) == "<0xEF>");
  CHECK(tok.id_to_token(ids[1]) == "<0xBF>");
  CHECK(tok.id_to_token(ids[2]) == "<0xBD>");
  CHECK(tok.decode(ids) == "\xef\xbf\xbd");
  CHECK(io::tokenizer_detail::replace_invalid_utf8("") == "");
  CHECK(io::tokenizer_detail::replace_invalid_utf8("ok \xc3\xa9") == "ok \xc3\xa9");
}

TEST_CASE("Gemma-style tokenizer: special ids, bos template, lookups", "[io][tokenizer]") {
  const Tokenizer tok = Tokenizer::from_file(fixture_path("gemma_bpe_1000.json"));
  CHECK(tok.token_id("<pad>") == 0);
  CHECK(tok.token_id("<eos>") == 1);
  CHECK(tok.token_id("<bos>") == 2);
  CHECK(tok.token_id("<unk>") == 3);
  CHECK(tok.token_id("<mask>") == 4);
  CHECK(tok.token_id("<|tool_response>") == 50);
  CHECK(tok.token_id("<|turn>") == 105);
  CHECK(tok.token_id("<turn|>") == 106);
  CHECK(tok.is_special(106));
  CHECK_FALSE(tok.is_special(tok.token_id("<0x41>")));
  CHECK(tok.special_prefix_ids() == std::vector<int>{2});
  CHECK(tok.encode("") == std::vector<int>{2});
  CHECK(tok.encode("", false).empty());
  CHECK_FALSE(tok.find_token("no such token").has_value());
  CHECK_THROWS_WITH(tok.token_id("no such token"), Contains("'no such token' is not in the vocabulary"));

  // Gemma 4's own file has no post-processor: nothing is added.
  const Tokenizer no_post = Tokenizer::from_file(fixture_path("gemma_bpe_4000.json"));
  CHECK(no_post.special_prefix_ids().empty());
  CHECK(no_post.encode("hi") == no_post.encode("hi", false));
}

TEST_CASE("decode rejects ids that name no token, naming the id", "[io][tokenizer]") {
  const Tokenizer tok = Tokenizer::from_file(fixture_path("gemma_bpe_1000.json"));
  REQUIRE(tok.id_limit() == 1000);
  for (const int id : {-1, tok.id_limit(), 1 << 30}) {
    const Error e = error_of([&] { tok.decode(std::vector<int>{2, id}); });
    CHECK(e.code() == StatusCode::kOutOfRange);
    CHECK_THAT(e.what(), Contains("token id " + std::to_string(id) + " is not in the vocabulary"));
    CHECK_THAT(e.what(), Contains("gemma_bpe_1000.json"));
  }
  CHECK_FALSE(tok.has_id(1000));
  CHECK(tok.has_id(999));
}

TEST_CASE("merges: string and pair formats agree, #version lines are skipped", "[io][tokenizer]") {
  Json pairs = base_json("gemma_bpe_1000.json");
  REQUIRE(pairs.at("model").at("merges")[0].is_array());
  Json strings = pairs;
  Json lines = Json::array({"#version: 0.2"});
  for (const Json& m : pairs.at("model").at("merges")) {
    lines.push_back(m[0].get<std::string>() + " " + m[1].get<std::string>());
  }
  strings["model"]["merges"] = lines;
  const Tokenizer a = Tokenizer::from_json(pairs, "pairs");
  const Tokenizer b = Tokenizer::from_json(strings, "strings");
  for (const Json& c : golden().at("corpus")) CHECK(a.encode(input_of(c)) == b.encode(input_of(c)));
}

TEST_CASE("unsupported components are rejected with the file, JSON path and type", "[io][tokenizer]") {
  SECTION("fixture with a ByteLevel pre-tokenizer") {
    const std::string path = fixture_path("unsupported_pre_tokenizer.json");
    const Error e = error_of([&] { Tokenizer::from_file(path); });
    CHECK(e.code() == StatusCode::kUnsupported);
    CHECK_THAT(e.what(), Contains(path + ": pre_tokenizer: pre-tokenizer type 'ByteLevel' is not supported"));
  }
  SECTION("fixture with NFKC inside a normalizer Sequence") {
    const std::string path = fixture_path("unsupported_nested_normalizer.json");
    const Error e = error_of([&] { Tokenizer::from_file(path); });
    CHECK(e.code() == StatusCode::kUnsupported);
    CHECK_THAT(e.what(), Contains(path + ": normalizer.normalizers[1]: normalizer type 'NFKC' is not supported"));
  }

  const Json base = base_json("gemma_bpe_1000.json");
  struct Case {
    const char* what;
    Json patch;  // merged into the base file with merge_patch
    const char* message;
  };
  const std::vector<Case> cases = {
      {"WordPiece model", Json::parse(R"({"model": {"type": "WordPiece"}})"),
       "t.json: model.type: model type 'WordPiece' is not supported"},
      {"Unigram model", Json::parse(R"({"model": {"type": "Unigram"}})"), "model type 'Unigram' is not supported"},
      {"BPE dropout", Json::parse(R"({"model": {"dropout": 0.1}})"),
       "t.json: model.dropout: BPE dropout 0.1 is not supported"},
      {"subword prefix", Json::parse(R"({"model": {"continuing_subword_prefix": "##"}})"),
       "t.json: model.continuing_subword_prefix: '##' is not supported"},
      {"end of word suffix", Json::parse(R"({"model": {"end_of_word_suffix": "</w>"}})"), "model.end_of_word_suffix"},
      {"regex normalizer", Json::parse(R"({"normalizer": {"pattern": {"String": null, "Regex": "\\s+"}}})"),
       "t.json: normalizer.pattern: Replace normalizer with a Regex pattern is not supported"},
      {"NFC normalizer", Json::parse(R"({"normalizer": {"type": "NFC"}})"),
       "t.json: normalizer: normalizer type 'NFC' is not supported"},
      {"Metaspace pre-tokenizer", Json::parse(R"({"pre_tokenizer": {"type": "Metaspace"}})"),
       "t.json: pre_tokenizer: pre-tokenizer type 'Metaspace' is not supported"},
      {"regex Split", Json::parse(R"({"pre_tokenizer": {"pattern": {"String": null, "Regex": " ?\\p{L}+"}}})"),
       "t.json: pre_tokenizer.pattern: Split pre-tokenizer with a Regex pattern is not supported"},
      {"ByteLevel decoder", Json::parse(R"({"decoder": {"type": "ByteLevel", "decoders": null}})"),
       "t.json: decoder: decoder type 'ByteLevel' is not supported"},
      {"Strip with stop",
       Json::parse(R"({"decoder": {"decoders": [{"type": "Strip", "content": " ", "start": 0, "stop": 1}]}})"),
       "t.json: decoder.decoders[0].stop: Strip decoder with stop=1 is not supported"},
      {"Bert post-processor", Json::parse(R"({"post_processor": {"type": "BertProcessing"}})"),
       "t.json: post_processor: post-processor type 'BertProcessing' is not supported"},
      {"truncation", Json::parse(R"({"truncation": {"max_length": 8}})"),
       "t.json: truncation: truncation in tokenizer.json is not supported"},
      {"padding", Json::parse(R"({"padding": {"pad_id": 0}})"),
       "t.json: padding: padding in tokenizer.json is not supported"},
  };
  for (const Case& c : cases) {
    INFO(c.what);
    Json j = base;
    j.merge_patch(c.patch);
    const Error e = error_of([&] { Tokenizer::from_json(j, "t.json"); });
    CHECK(e.code() == StatusCode::kUnsupported);
    CHECK_THAT(e.what(), Contains(c.message));
  }

  SECTION("single_word added token") {
    Json j = base;
    j["added_tokens"][5]["single_word"] = true;
    const Error e = error_of([&] { Tokenizer::from_json(j, "t.json"); });
    CHECK(e.code() == StatusCode::kUnsupported);
    CHECK_THAT(e.what(), Contains("t.json: added_tokens[5].single_word: added token '<unused0>' has single_word=true"));
  }
}

TEST_CASE("malformed tokenizer.json files are format errors that name the key", "[io][tokenizer]") {
  const Json base = base_json("gemma_bpe_1000.json");
  SECTION("merge of an unknown token") {
    Json j = base;
    j["model"]["merges"].push_back(Json::array({"zzqq", "x"}));
    const Error e = error_of([&] { Tokenizer::from_json(j, "t.json"); });
    CHECK(e.code() == StatusCode::kFormatError);
    CHECK_THAT(e.what(), Contains("t.json: model.merges: merge"));
    CHECK_THAT(e.what(), Contains("not in the vocabulary ('zzqq')"));
  }
  SECTION("merge string with three parts") {
    Json j = base;
    j["model"]["merges"] = Json::array({"a b c"});
    CHECK_THROWS_WITH(Tokenizer::from_json(j, "t.json"), Contains("is not two tokens separated by one space"));
  }
  SECTION("template that names a missing special token") {
    Json j = base;
    j["post_processor"]["single"][0]["SpecialToken"]["id"] = "<nope>";
    CHECK_THROWS_WITH(Tokenizer::from_json(j, "t.json"), Contains("'<nope>' is not in special_tokens"));
  }
  SECTION("template that uses the text other than once") {
    // `tokenizers` would repeat the text (twice) or drop it (never), even without special tokens.
    Json j = base;
    j["post_processor"]["single"].push_back(Json::parse(R"({"Sequence": {"id": "A", "type_id": 0}})"));
    CHECK_THROWS_WITH(Tokenizer::from_json(j, "t.json"), Contains("t.json: post_processor.single") && Contains("2 times"));
    j["post_processor"]["single"] = Json::parse(R"([{"SpecialToken": {"id": "<bos>", "type_id": 0}}])");
    CHECK_THROWS_WITH(Tokenizer::from_json(j, "t.json"), Contains("0 times"));
  }
  SECTION("an added token listed twice with different flags") {
    Json j = base;
    Json again = j["added_tokens"][5];
    again["normalized"] = !again["normalized"].get<bool>();
    j["added_tokens"].push_back(again);
    CHECK_THROWS_WITH(Tokenizer::from_json(j, "t.json"), Contains("is listed again with different"));
    j["added_tokens"].back() = j["added_tokens"][5];  // the same entry twice is harmless
    CHECK_NOTHROW(Tokenizer::from_json(j, "t.json"));
  }
  SECTION("missing model") {
    Json j = base;
    j.erase("model");
    CHECK_THROWS_WITH(Tokenizer::from_json(j, "t.json"), Contains("t.json: missing required key 'model'"));
  }
  SECTION("unknown version") {
    Json j = base;
    j["version"] = "2.0";
    CHECK_THROWS_WITH(Tokenizer::from_json(j, "t.json"), Contains("unknown tokenizer.json version '2.0'"));
  }
  SECTION("one far-out id in a small vocabulary (would size id tables in gigabytes)") {
    Json j = base;
    j["model"]["vocab"]["far_out"] = 200000000;
    const Error e = error_of([&] { Tokenizer::from_json(j, "t.json"); });
    CHECK(e.code() == StatusCode::kFormatError);
    CHECK_THAT(e.what(), Contains("t.json: model.vocab"));
    CHECK_THAT(e.what(), Contains("largest id is 200000000"));
  }
  SECTION("missing file") {
    const Error e = error_of([&] { Tokenizer::from_file(fixture_path("does_not_exist.json")); });
    CHECK(e.code() == StatusCode::kNotFound);
  }
}

TEST_CASE("unknown characters without byte fallback become one fused <unk>", "[io][tokenizer]") {
  const Tokenizer tok = Tokenizer::from_file(fixture_path("gemma_bpe_300_unk.json"));
  const int unk = tok.token_id("<unk>");
  const std::vector<int> ids = tok.encode("\xe2\x98\x83\xe2\x98\x83", false);  // two snowmen, unseen in training
  CHECK(ids == std::vector<int>{unk});
  CHECK(tok.decode(ids) == "");
  CHECK(tok.decode(ids, false) == "<unk>");
}

TEST_CASE("a long segment between added tokens encodes exactly and independently", "[io][tokenizer]") {
  // Gemma has no splitting pre-tokenizer: the whole text between added tokens is one BPE word.
  const Tokenizer tok = Tokenizer::from_file(fixture_path("gemma_bpe_1000.json"));
  const Json& corpus = golden().at("corpus");
  std::size_t longest = 0;
  for (std::size_t i = 0; i < corpus.size(); ++i) {
    if (corpus[i].at("text").get<std::string>().size() > corpus[longest].at("text").get<std::string>().size())
      longest = i;
  }
  const std::string para = corpus[longest].at("text").get<std::string>();
  const std::vector<int> para_ids = ids_of(golden().at("tokenizers")[1].at("results").at(longest).at("ids_no_special"));
  REQUIRE(para.size() > 1000);
  REQUIRE(tok.encode(para, false) == para_ids);
  std::string big;
  std::vector<int> expected;
  for (int i = 0; i < 100; ++i) {
    big += para + "<eos>";
    expected.insert(expected.end(), para_ids.begin(), para_ids.end());
    expected.push_back(1);
  }
  CHECK(tok.encode(big, false) == expected);
}

namespace {

// A small tokenizer whose vocabulary has " " and "x"; tests below change its added tokens and components.
const char* const kSmallTokenizer = R"({"version": "1.0", "truncation": null, "padding": null,
  "added_tokens": [{"id": 3, "content": " ", "single_word": false, "lstrip": true, "rstrip": true,
                    "normalized": false, "special": false}],
  "normalizer": null, "pre_tokenizer": null, "post_processor": null, "decoder": null,
  "model": {"type": "BPE", "dropout": null, "unk_token": "<unk>", "continuing_subword_prefix": null,
            "end_of_word_suffix": null, "fuse_unk": true, "byte_fallback": false, "ignore_merges": false,
            "vocab": {"<unk>": 0, "a": 1, "b": 2, " ": 3, "x": 4}, "merges": []}})";

}  // namespace

TEST_CASE("an lstrip match left empty by an earlier rstrip emits nothing", "[io][tokenizer]") {
  // Expected ids are Hugging Face tokenizers 0.23.3's output on the same tokenizer.json.
  SECTION("' ' with lstrip and rstrip: a run of spaces is one token") {
    const Tokenizer tok = Tokenizer::from_json(Json::parse(kSmallTokenizer), "t.json");
    CHECK(tok.encode("a  b") == std::vector<int>{1, 3, 2});
    CHECK(tok.encode("a   b") == std::vector<int>{1, 3, 2});
    CHECK(tok.encode("  ") == std::vector<int>{3});
    CHECK(tok.encode("a    ") == std::vector<int>{1, 3});
    CHECK(tok.encode("    b") == std::vector<int>{3, 2});
    CHECK(tok.encode("a" + std::string(5000, ' ') + "b") == std::vector<int>{1, 3, 2});
  }
  SECTION("'x' with rstrip, then ' ' with lstrip inside the spaces it took") {
    Json j = Json::parse(kSmallTokenizer);
    j["added_tokens"] = Json::parse(R"([
      {"id": 4, "content": "x", "single_word": false, "lstrip": false, "rstrip": true, "normalized": false,
       "special": false},
      {"id": 3, "content": " ", "single_word": false, "lstrip": true, "rstrip": false, "normalized": false,
       "special": false}])");
    const Tokenizer tok = Tokenizer::from_json(j, "t.json");
    CHECK(tok.encode("x b") == std::vector<int>{4, 2});
    // Here the second " " would end before it starts: tokenizers 0.23.3 panics ("AddedVocabulary bad split");
    // this tokenizer skips that match as it skips an empty one.
    CHECK(tok.encode("x  b") == std::vector<int>{4, 2});
  }
}

TEST_CASE("Sequences nested more than 64 deep are refused, naming the path", "[io][tokenizer]") {
  // Hugging Face tokenizers 0.23.3 loads 62 nested Sequences and refuses 63 ("recursion limit exceeded").
  struct Case {
    const char* component;
    const char* list;
    const char* leaf;
  };
  const std::vector<Case> cases = {
      {"normalizer", "normalizers", R"({"type": "Prepend", "prepend": "_"})"},
      {"pre_tokenizer", "pretokenizers",
       R"({"type": "Split", "pattern": {"String": " "}, "behavior": "Isolated", "invert": false})"},
      {"decoder", "decoders", R"({"type": "Fuse"})"},
  };
  const auto nested = [](const Case& c, int levels) {
    Json j = Json::parse(kSmallTokenizer);
    Json component = Json::parse(c.leaf);
    for (int k = 0; k < levels; ++k) component = Json{{"type", "Sequence"}, {c.list, Json::array({component})}};
    j[c.component] = component;
    return j;
  };
  for (const Case& c : cases) {
    INFO(c.component);
    CHECK_NOTHROW(Tokenizer::from_json(nested(c, 64), "t.json"));
    const Error e = error_of([&] { Tokenizer::from_json(nested(c, 65), "t.json"); });
    CHECK(e.code() == StatusCode::kFormatError);
    std::string path = c.component;
    for (int k = 0; k < 64; ++k) path += std::string(".") + c.list + "[0]";
    CHECK_THAT(e.what(), Contains("t.json: " + path + ": Sequence nested more than 64 levels deep"));
  }
}

TEST_CASE("negative ids in the post-processor's special_tokens are format errors", "[io][tokenizer]") {
  // Hugging Face tokenizers 0.23.3 refuses both files: it reads every entry's ids as u32, used or not.
  Json j = Json::parse(kSmallTokenizer);
  j["post_processor"] = Json::parse(R"({"type": "TemplateProcessing",
    "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
    "pair": [{"Sequence": {"id": "A", "type_id": 0}}],
    "special_tokens": {"<s>": {"id": "<s>", "ids": [0], "tokens": ["<s>"]},
                       "<u>": {"id": "<u>", "ids": [1], "tokens": ["<u>"]}}})");
  REQUIRE(Tokenizer::from_json(j, "t.json").encode("ab") == std::vector<int>{0, 1, 2});  // tokenizers: [0, 1, 2]
  SECTION("used by the template") {
    j["post_processor"]["special_tokens"]["<s>"]["ids"] = Json::array({-1});
    const Error e = error_of([&] { Tokenizer::from_json(j, "t.json"); });
    CHECK(e.code() == StatusCode::kFormatError);
    CHECK_THAT(e.what(), Contains("t.json: post_processor.special_tokens.<s>.ids: id -1 is negative"));
  }
  SECTION("not used by the template") {
    j["post_processor"]["special_tokens"]["<u>"]["ids"] = Json::array({-2});
    const Error e = error_of([&] { Tokenizer::from_json(j, "t.json"); });
    CHECK(e.code() == StatusCode::kFormatError);
    CHECK_THAT(e.what(), Contains("t.json: post_processor.special_tokens.<u>.ids: id -2 is negative"));
  }
}
