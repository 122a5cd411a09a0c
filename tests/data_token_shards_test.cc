// Token shards in llm.c's .bin format (data/token_shards.h) and `troupe convert text`.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <zlib.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "data/convert.h"
#include "data/dataset.h"
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

// A shard laid out as llm.c's data_common.py writes it, by hand: 256 little-endian int32 (magic,
// version, count, zeros), then the tokens in `width` bytes each.
std::string llmcShard(std::int32_t magic, std::int32_t version, const std::vector<std::uint32_t>& t,
                      int width, std::int32_t count) {
  std::vector<std::int32_t> header(256, 0);
  header[0] = magic;
  header[1] = version;
  header[2] = count;
  std::string bytes(reinterpret_cast<const char*>(header.data()), 1024);
  for (std::uint32_t v : t)
    bytes.append(reinterpret_cast<const char*>(&v), static_cast<std::size_t>(width));
  return bytes;
}

void write(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary) << bytes;
}

TEST(TokenShards, ReadsGpt2AndLlama3ShardsAsLlmcWritesThem) {
  TempDir dir;
  write(dir / "gpt2.bin", llmcShard(20240520, 1, {50256, 464, 0, 65535}, 2, 4));
  EXPECT_THAT(readTokenShard(dir / "gpt2.bin").tokens, ElementsAre(50256, 464, 0, 65535));
  EXPECT_EQ(readTokenShard(dir / "gpt2.bin").token_bytes, 2);
  write(dir / "llama.bin", llmcShard(20240801, 7, {128000, 9906, 128255}, 4, 3));
  EXPECT_THAT(readTokenShard(dir / "llama.bin").tokens, ElementsAre(128000, 9906, 128255));
  EXPECT_EQ(readTokenShard(dir / "llama.bin").token_bytes, 4);
  // An empty shard is a shard, in either layout (the fuzzer's first find: an empty Llama 3 one).
  write(dir / "empty.bin", llmcShard(20240520, 1, {}, 2, 0));
  EXPECT_TRUE(readTokenShard(dir / "empty.bin").tokens.empty());
  write(dir / "empty_llama.bin", llmcShard(20240801, 7, {}, 4, 0));
  EXPECT_TRUE(readTokenShard(dir / "empty_llama.bin").tokens.empty());
}

TEST(TokenShards, WritesLlmcsLayoutByteForByteAndWidensOnlyWhereATokenNeedsIt) {
  TempDir dir;
  writeTokenShard(dir / "narrow.bin", std::vector<std::uint32_t>{1, 2, 65535});
  std::ifstream in(dir / "narrow.bin", std::ios::binary);
  const std::string bytes((std::istreambuf_iterator<char>(in)), {});
  EXPECT_EQ(bytes, llmcShard(20240520, 1, {1, 2, 65535}, 2, 3));
  writeTokenShard(dir / "wide.bin", std::vector<std::uint32_t>{1, 65536});
  const auto wide = readTokenShard(dir / "wide.bin");
  EXPECT_EQ(wide.token_bytes, 4);
  EXPECT_THAT(wide.tokens, ElementsAre(1, 65536));
  EXPECT_FALSE(fs::exists(dir / "wide.bin.tmp"));
}

TEST(TokenShards, ADamagedShardIsRefusedNamingTheFileAndWhatIsWrong) {
  TempDir dir;
  write(dir / "short.bin", llmcShard(20240520, 1, {1, 2}, 2, 3));  // a token short
  EXPECT_THAT(errorOf([&] { readTokenShard(dir / "short.bin"); }),
              AllOf(HasSubstr(dir / "short.bin"), HasSubstr("header says 3 tokens of 2 bytes"),
                    HasSubstr("truncated")));
  write(dir / "magic.bin", llmcShard(20240521, 1, {1}, 2, 1));
  EXPECT_THAT(errorOf([&] { readTokenShard(dir / "magic.bin"); }),
              AllOf(HasSubstr(dir / "magic.bin"), HasSubstr("magic 20240521 version 1"),
                    HasSubstr("GPT-2's: 20240520 version 1")));
  write(dir / "version.bin", llmcShard(20240520, 7, {1}, 2, 1));  // GPT-2's magic, Llama's version
  EXPECT_THAT(errorOf([&] { readTokenShard(dir / "version.bin"); }),
              HasSubstr("magic 20240520 version 7"));
  write(dir / "negative.bin", llmcShard(20240520, 1, {}, 2, -5));
  EXPECT_THAT(errorOf([&] { readTokenShard(dir / "negative.bin"); }),
              HasSubstr("header says -5 tokens"));
  write(dir / "header.bin", std::string(100, '\0'));
  EXPECT_THAT(errorOf([&] { readTokenShard(dir / "header.bin"); }),
              HasSubstr("is 100 bytes, shorter than its 1024-byte header"));
  EXPECT_THAT(errorOf([&] { readTokenShard(dir / "missing.bin"); }),
              AllOf(HasSubstr(dir / "missing.bin"), HasSubstr("does not exist")));
}

TEST(ConvertText, EachByteIsATokenTheValidationShardComesFirstAndTrainShardsFollowInOrder) {
  TempDir dir;
  // 20 bytes in two files, with UTF-8 (two bytes for the e acute) and a newline.
  write(dir / "a.txt", "Caf\xc3\xa9 au lait\n");
  write(dir / "b.txt", "tout !");
  const auto r =
      testing::runTroupe("convert text " + (dir / "a.txt") + " " + (dir / "b.txt") + " --out " +
                         (dir / "shards") + " --name cafe --val_fraction 0.25 --shard_size 6");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("wrote 5 validation and 15 training tokens (byte-level; 3 train "
                                  "shard(s))"));
  const std::string text = "Caf\xc3\xa9 au lait\ntout !";
  std::vector<std::uint32_t> all;
  for (const auto& path : tokenShardsIn(dir / "shards", "val"))
    all = readTokenShard(path).tokens;
  EXPECT_EQ(all, byteTokens(text.substr(0, 5)));
  const auto train = tokenShardsIn(dir / "shards", "train");
  ASSERT_EQ(train.size(), 3u);
  EXPECT_EQ(fs::path(train[0]).filename(), "cafe_train_000001.bin");
  EXPECT_EQ(fs::path(train[2]).filename(), "cafe_train_000003.bin");
  std::vector<std::uint32_t> rest;
  for (const auto& path : train) {
    const auto shard = readTokenShard(path);
    EXPECT_LE(shard.tokens.size(), 6u) << path;
    rest.insert(rest.end(), shard.tokens.begin(), shard.tokens.end());
  }
  EXPECT_EQ(rest, byteTokens(text.substr(5)));
  EXPECT_EQ(byteTokens("\xc3\xa9"), (std::vector<std::uint32_t>{0xc3, 0xa9}));
}

TEST(ConvertText, BadInputIsOneErrorNamingTheCulpritAndNothingIsOverwritten) {
  TempDir dir;
  write(dir / "a.txt", "some text");
  const std::string convert = "convert text " + (dir / "a.txt") + " --out " + (dir / "out");
  ASSERT_EQ(testing::runTroupe(convert).exit_code, 0);
  const auto before = fs::last_write_time(dir / "out/text_train_000001.bin");
  auto r = testing::runTroupe(convert);
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.output, AllOf(HasSubstr(dir / "out"), HasSubstr("holds token shards already")));
  EXPECT_EQ(fs::last_write_time(dir / "out/text_train_000001.bin"), before);
  r = testing::runTroupe("convert text " + (dir / "nothing.txt") + " --out " + (dir / "o2"));
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.output, AllOf(HasSubstr(dir / "nothing.txt"), HasSubstr("does not exist")));
  for (const std::string bad : {"nan", "1", "-0.5"}) {
    r = testing::runTroupe("convert text " + (dir / "a.txt") + " --out " + (dir / "o3") +
                           " --val_fraction " + bad);
    EXPECT_EQ(r.exit_code, 1) << bad;
    EXPECT_THAT(r.output, HasSubstr("--val_fraction")) << bad;
  }
  write(dir / "empty.txt", "");
  r = testing::runTroupe("convert text " + (dir / "empty.txt") + " --out " + (dir / "o4"));
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.output, HasSubstr("hold no text"));
  EXPECT_FALSE(fs::exists(dir / "o3"));
  EXPECT_FALSE(fs::exists(dir / "o4"));
  EXPECT_THAT(errorOf([&] { tokenShardsIn(dir / "out", "test"); }),
              AllOf(HasSubstr("no test shard"), HasSubstr(dir / "out")));
}

// The English corpus of the text tests and benchmarks: Debian's dict-gcide (scripts/setup.sh
// installs it), the Collaborative International Dictionary of English, whose dictzip file is
// gzip: converted as it is, every decompressed byte a token, in order.
TEST(ConvertText, TheEnglishCorpusConvertsFromItsDictzipFile) {
  const std::string corpus = "/usr/share/dictd/gcide.dict.dz";
  std::string text;
  gzFile file = gzopen(corpus.c_str(), "rb");
  ASSERT_NE(file, nullptr) << corpus << " (scripts/setup.sh installs dict-gcide)";
  char buffer[1 << 16];
  for (int n; (n = gzread(file, buffer, sizeof buffer)) > 0;)
    text.append(buffer, static_cast<std::size_t>(n));
  gzclose(file);
  ASSERT_GE(text.size(), 5'000'000u);  // the "at least 5 MB"
  TempDir dir;
  const auto r = testing::runTroupe("convert text " + corpus + " --out " + (dir / "gcide") +
                                    " --name gcide --val_fraction 0.01 --shard_size 16000000");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  std::vector<std::string> shards = tokenShardsIn(dir / "gcide", "val");
  const auto train = tokenShardsIn(dir / "gcide", "train");
  EXPECT_EQ(train.size(), (text.size() - text.size() / 100 + 15'999'999) / 16'000'000);
  shards.insert(shards.end(), train.begin(), train.end());
  std::size_t at = 0;
  for (const auto& path : shards) {
    const auto tokens = readTokenShard(path).tokens;
    ASSERT_LE(at + tokens.size(), text.size()) << path;
    EXPECT_EQ(tokens, byteTokens(std::string_view(text).substr(at, tokens.size()))) << path;
    at += tokens.size();
  }
  EXPECT_EQ(at, text.size());
}

// A token dataset's record i is tokens [i t, i t + t) of the shards end to end, each labelled with
// the next token, the last record's last label the first token past it; a folder gives its train
// or val split, a glob its matches in order.
TEST(TokenDataset, RecordsAreConsecutiveSequencesLabelledWithTheNextTokens) {
  TempDir dir;
  writeTokenShard(dir / "t_val_000000.bin", std::vector<std::uint32_t>{9, 8, 7});
  writeTokenShard(dir / "t_train_000001.bin", std::vector<std::uint32_t>{0, 1, 2, 3});
  writeTokenShard(dir / "t_train_000002.bin", std::vector<std::uint32_t>{4, 5, 6});
  DatasetOptions o;
  o.sequence_length = 3;
  o.num_labels = 10;
  o.train = true;
  for (const std::string& path : {dir.str(), dir / "t_train_*.bin"}) {
    o.path = path;
    auto d = openDataset(o);
    ASSERT_EQ(d->size(), 2) << path;  // (7 - 1) / 3
    std::vector<std::int32_t> tokens(6), labels(6);
    d->read({1, 0}, 0, tokens.data(), labels.data());
    EXPECT_THAT(tokens, ElementsAre(3, 4, 5, 0, 1, 2)) << path;
    EXPECT_THAT(labels, ElementsAre(4, 5, 6, 1, 2, 3)) << path;
    EXPECT_THAT(errorOf([&] { d->read({2}, 0, tokens.data(), labels.data()); }),
                HasSubstr("sequence 2 of token shards"));
    std::vector<float> images(6);
    EXPECT_THAT(errorOf([&] { d->read({0}, 0, images.data(), labels.data()); }),
                HasSubstr("hold token sequences, not images"));
  }
  o.path = dir.str();
  o.train = false;
  o.sequence_length = 2;
  EXPECT_EQ(openDataset(o)->size(), 1);  // the val shard: (3 - 1) / 2
  // A token outside the vocabulary is found when a sequence holding it (or its label) is read,
  // named by its shard and its place there: the shards are mapped, not read, when opened.
  o.num_labels = 9;
  std::vector<std::int32_t> tokens(3), labels(3);
  auto val = openDataset(o);
  EXPECT_EQ(errorOf([&] { val->read({0}, 0, tokens.data(), labels.data()); }),
            "token shard '" + (dir / "t_val_000000.bin") +
                "': token 9 at position 0 is outside the vocabulary [0, 9) (vocab_size)");
  o.train = true;
  o.sequence_length = 3;
  o.num_labels = 6;
  auto train = openDataset(o);
  train->read({0}, 0, tokens.data(), labels.data());
  EXPECT_EQ(errorOf([&] { train->read({1}, 0, tokens.data(), labels.data()); }),
            "token shard '" + (dir / "t_train_000002.bin") +
                "': token 6 at position 2 is outside the vocabulary [0, 6) (vocab_size)");
  o.path = dir / "nothing_*.bin";
  EXPECT_EQ(errorOf([&] { openDataset(o); }), "token shards '" + o.path + "': no file matches");
}

}  // namespace
}  // namespace troupe::data
