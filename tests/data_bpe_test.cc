// GPT-2's byte-level BPE (data/bpe.h) and `troupe convert text --vocab --merges`, against Hugging
// Face tokenizers' byte-level BPE (tests/bpe_reference.py, in .venv-tokenizers).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <fmt/format.h>

#include <cctype>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "data/bpe.h"
#include "data/token_shards.h"
#include "data_test_util.h"
#include "troupe/error.h"

namespace troupe::data {
namespace {

namespace fs = std::filesystem;
using ::testing::AllOf;
using ::testing::ElementsAre;
using testing::errorOf;
using ::testing::HasSubstr;
using testing::TempDir;

std::vector<std::string> piecesOf(std::string_view text) {
  std::vector<std::string> out;
  for (const auto piece : gpt2Pieces(text))
    out.emplace_back(piece);
  return out;
}

// Each split follows from the pattern's alternatives, tried in order at each position:
// contractions; an optional space before a run of letters, of numbers, or of anything else but
// whitespace; a run of whitespace less its last character where a non-space follows (which then
// leads the next piece), or else the whole run.
TEST(Gpt2Pieces, SplitAsGpt2sPatternDoes) {
  EXPECT_THAT(piecesOf("Hello world"), ElementsAre("Hello", " world"));
  EXPECT_THAT(piecesOf("I'm don't we'll"), ElementsAre("I", "'m", " don", "'t", " we", "'ll"));
  EXPECT_THAT(piecesOf("'x"), ElementsAre("'", "x"));  // no contraction: punctuation
  EXPECT_THAT(piecesOf("a  b"), ElementsAre("a", " ", " b"));
  EXPECT_THAT(piecesOf("\t word"), ElementsAre("\t", " word"));
  EXPECT_THAT(piecesOf("x\n\ny"), ElementsAre("x", "\n", "\n", "y"));  // the last one alone
  EXPECT_THAT(piecesOf("end  "), ElementsAre("end", "  "));            // at the end: the whole run
  EXPECT_THAT(piecesOf("42 apples, 3.5!"), ElementsAre("42", " apples", ",", " 3", ".", "5", "!"));
  EXPECT_THAT(piecesOf("!!! ?"), ElementsAre("!!!", " ?"));
  // Letters and numbers by Unicode's categories: e acute (Ll), CJK (Lo), Arabic-Indic digits (Nd).
  EXPECT_THAT(piecesOf("caf\xc3\xa9 \xe6\x9d\xb1\xe4\xba\xac \xd9\xa3\xd9\xa4"),
              ElementsAre("caf\xc3\xa9", " \xe6\x9d\xb1\xe4\xba\xac", " \xd9\xa3\xd9\xa4"));
  // A no-break space is whitespace (White_Space), but not the space the pattern's " ?" takes.
  EXPECT_THAT(piecesOf("  \xc2\xa0x"), ElementsAre("  ", "\xc2\xa0", "x"));
  // A byte that is not UTF-8 is neither letter, number nor space.
  EXPECT_THAT(piecesOf("a\xff\xfe b"), ElementsAre("a", "\xff\xfe", " b"));
  std::string joined;
  for (const auto& piece : piecesOf("Mixed: 'tis 3x\r\n  \tend. "))
    joined += piece;
  EXPECT_EQ(joined, "Mixed: 'tis 3x\r\n  \tend. ");
}

// The JSON of a list of strings (UTF-8 text passes as it is).
std::string jsonStrings(const std::vector<std::string>& texts) {
  std::string out = "[";
  for (const auto& text : texts) {
    out += out.size() > 1 ? ",\"" : "\"";
    for (const char c : text) {
      if (c == '"' || c == '\\') {
        out += '\\';
        out += c;
      } else if (static_cast<unsigned char>(c) < 0x20) {
        char escape[8];
        std::snprintf(escape, sizeof escape, "\\u%04x", static_cast<unsigned>(c));
        out += escape;
      } else {
        out += c;
      }
    }
    out += '"';
  }
  return out + "]";
}

// A JSON list of lists of non-negative integers.
std::vector<std::vector<std::uint32_t>> parseIdLists(const std::string& json) {
  std::vector<std::vector<std::uint32_t>> lists;
  int depth = 0;
  for (std::size_t at = 0; at < json.size(); ++at) {
    const char c = json[at];
    if (c == '[') {
      if (++depth == 2) lists.emplace_back();
    } else if (c == ']') {
      --depth;
    } else if (std::isdigit(static_cast<unsigned char>(c)) && depth == 2) {
      std::uint32_t v = 0;
      while (at < json.size() && std::isdigit(static_cast<unsigned char>(json[at])))
        v = v * 10 + static_cast<std::uint32_t>(json[at++] - '0');
      --at;
      lists.back().push_back(v);
    }
  }
  return lists;
}

const std::string kLicenses = "/usr/share/common-licenses/";

// Hugging Face's byte-level BPE trained on four licences (vocabulary 1000), saved in GPT-2's
// format in `dir`, and the ids it gives `texts` and then each of `files`.
std::vector<std::vector<std::uint32_t>> referenceIds(const TempDir& dir,
                                                     const std::vector<std::string>& texts,
                                                     const std::vector<std::string>& files) {
  const std::string source = TROUPE_SOURCE_DIR;
  const std::string python = source + "/.venv-tokenizers/bin/python";
  if (!fs::exists(python)) {
    ADD_FAILURE() << python << " is missing: scripts/setup.sh makes it";
    return {};
  }
  {
    std::ofstream out(dir / "texts.json", std::ios::binary);
    out << jsonStrings(texts);
  }
  std::string command = python + " " + source + "/tests/bpe_reference.py --corpus";
  for (const char* name : {"GPL-3", "Apache-2.0", "GPL-2", "LGPL-2.1"})
    command += " " + kLicenses + name;
  command +=
      " --vocab-size 1000 --out " + dir.str() + " --texts " + (dir / "texts.json") + " --encode";
  for (const auto& file : files)
    command += " " + file;
  const auto r = testing::runShell(command);
  EXPECT_EQ(r.exit_code, 0) << r.output;
  return parseIdLists(r.output);
}

std::string fileText(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// The same ids as Hugging Face's tokenizer, to the token, for the splits above, text in several
// scripts, and whole licences it was not trained on.
TEST(Gpt2Tokenizer, GivesTheIdsOfHuggingFacesByteLevelBpe) {
  TempDir dir;
  const std::vector<std::string> texts = {
      "Hello world",
      "I'm don't we'll 'x",
      "a  b\t word x\n\ny end  ",
      "42 apples, 3.5! !!! ?",
      "caf\xc3\xa9 \xe6\x9d\xb1\xe4\xba\xac \xd9\xa3\xd9\xa4 na\xc3\xafve \xce\xb1\xce\xb2\xce\xb3",
      "  \xc2\xa0x \xe2\x80\x83y \xf0\x9f\x99\x82 smile",
      "Permission is hereby granted, free of charge; THE SOFTWARE IS PROVIDED \"AS IS\".\r\n",
      "<|endoftext|> as text"};
  const std::vector<std::string> files = {kLicenses + "MPL-2.0", kLicenses + "Artistic"};
  const auto expected = referenceIds(dir, texts, files);
  ASSERT_EQ(expected.size(), texts.size() + files.size());
  auto tokenizer = Gpt2Tokenizer::load(dir / "vocab.json", dir / "merges.txt");
  EXPECT_EQ(tokenizer.vocabSize(), 1000);
  EXPECT_EQ(tokenizer.endOfText(), 0u);  // the trainer's first token: its special token
  for (std::size_t k = 0; k < texts.size(); ++k)
    EXPECT_EQ(tokenizer.encode(texts[k]), expected[k]) << "text " << k << ": " << texts[k];
  for (std::size_t k = 0; k < files.size(); ++k) {
    const auto ids = tokenizer.encode(fileText(files[k]));
    EXPECT_EQ(ids, expected[texts.size() + k]) << files[k];
    EXPECT_EQ(tokenizer.decode(ids), fileText(files[k])) << files[k];
    EXPECT_LT(ids.size(), fileText(files[k]).size() / 2) << "merges hardly applied";
  }
}

// Shards of BPE tokens: "<|endoftext|>" before each file's tokens (llm.c's documents), the
// validation shard first; the line names the vocab_size to train with.
TEST(ConvertText, GptBpeShardsHoldEachFilesTokensAfterAnEndOfText) {
  TempDir dir;
  const std::vector<std::string> files = {kLicenses + "MPL-2.0", kLicenses + "Artistic"};
  const auto expected = referenceIds(dir, {}, files);
  ASSERT_EQ(expected.size(), 2u);
  const auto r = testing::runTroupe("convert text " + files[0] + " " + files[1] + " --out " +
                                    (dir / "shards") + " --vocab " + (dir / "vocab.json") +
                                    " --merges " + (dir / "merges.txt") + " --val_fraction 0.1");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_THAT(r.output, AllOf(HasSubstr("(GPT-2's BPE; 1 train shard(s))"),
                              HasSubstr("train with --vocab_size 1000")));
  std::vector<std::uint32_t> want = {0};
  want.insert(want.end(), expected[0].begin(), expected[0].end());
  want.push_back(0);
  want.insert(want.end(), expected[1].begin(), expected[1].end());
  std::vector<std::uint32_t> got;
  for (const char* split : {"val", "train"}) {
    for (const auto& path : tokenShardsIn(dir / "shards", split)) {
      const auto shard = readTokenShard(path);
      EXPECT_EQ(shard.token_bytes, 2) << path;
      got.insert(got.end(), shard.tokens.begin(), shard.tokens.end());
    }
  }
  EXPECT_EQ(got, want);
  EXPECT_EQ(readTokenShard(tokenShardsIn(dir / "shards", "val").at(0)).tokens.size(),
            want.size() / 10);
}

TEST(Gpt2Tokenizer, BadFilesAreOneErrorNamingTheFileAndWhere) {
  TempDir dir;
  auto write = [&](const std::string& name, const std::string& text) {
    std::ofstream(dir / name, std::ios::binary) << text;
    return dir / name;
  };
  // Every byte's token, each byte as its id: in GPT-2's mapping ('!' as itself, the space as
  // U+0120), or with the bytes outside the printable ones all as U+0000 (not GPT-2's mapping).
  auto byteVocabulary = [](bool gpt2s) {
    std::string json = "{";
    int next = 256;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
      const int c = printable ? b : gpt2s ? next++ : 0;
      json += "\"\\u" + fmt::format("{:04x}", c) + "\": " + std::to_string(b) + ",";
    }
    return json;
  };
  const std::string vocab = byteVocabulary(false), good = byteVocabulary(true);
  const std::string merges = write("merges.txt", "#version: 0.2\nh i\n");
  EXPECT_THAT(
      errorOf([&] { Gpt2Tokenizer::load(write("v1.json", vocab + "\"hi\": 256}"), merges); }),
      AllOf(HasSubstr("v1.json"), HasSubstr("lacks the token of byte 0")));
  const auto ok = write("ok.json", good + "\"hi\": 256}");
  EXPECT_EQ(Gpt2Tokenizer::load(ok, merges).encode("hi!"), (std::vector<std::uint32_t>{256, 33}));
  EXPECT_THAT(errorOf([&] { Gpt2Tokenizer::load(write("cut.json", good + "\"hi\": "), merges); }),
              AllOf(HasSubstr("cut.json"), HasSubstr("expected a non-negative integer id"),
                    HasSubstr("at byte ")));
  EXPECT_THAT(errorOf([&] { Gpt2Tokenizer::load(ok, write("m2.txt", "#version: 0.2\nhi\n")); }),
              AllOf(HasSubstr("m2.txt"), HasSubstr("line 2"), HasSubstr("'hi' is not two tokens")));
  EXPECT_THAT(errorOf([&] { Gpt2Tokenizer::load(ok, write("m3.txt", "h i\nhi !\n")); }),
              AllOf(HasSubstr("m3.txt"), HasSubstr("line 2"),
                    HasSubstr("lacks the merge's result "
                              "'hi!'")));
  EXPECT_THAT(errorOf([&] { Gpt2Tokenizer::load(dir / "none.json", merges); }),
              AllOf(HasSubstr("none.json"), HasSubstr("cannot be read")));
  const auto r = testing::runTroupe("convert text " + kLicenses + "GPL-3 --out " + (dir / "o") +
                                    " --vocab " + ok);
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.output, HasSubstr("needs its vocabulary and its merges (--vocab and --merges); "
                                  "only --vocab was given"));
  EXPECT_FALSE(fs::exists(dir / "o"));
}

}  // namespace
}  // namespace troupe::data
