// Text as token shards in llm.c's .bin format (karpathy/llm.c, dev/data/data_common.py), so that
// data llm.c's scripts prepared trains as it is: a header of 256 little-endian int32 (the magic,
// the version, the token count; the rest 0), then the tokens. GPT-2's shards: magic 20240520,
// version 1, uint16 tokens; Llama 3's: magic 20240801, version 7, uint32 tokens.
// `troupe convert text` writes them from text files (data/convert.h: byte-level tokens).
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace troupe::data {

inline constexpr std::int32_t kGpt2ShardMagic = 20240520;    // version 1: uint16 tokens
inline constexpr std::int32_t kLlama3ShardMagic = 20240801;  // version 7: uint32 tokens
inline constexpr std::size_t kShardHeaderInts = 256;

struct TokenShard {
  std::string path;
  int token_bytes = 2;                // 2 (GPT-2's) or 4 (Llama 3's)
  std::vector<std::uint32_t> tokens;  // widened to 32 bits
};

// Reads a shard whole. InputError naming the file for a missing or unreadable file, an unknown
// magic or version, a negative token count, or a size other than the header's and the count's
// (a truncated or padded file).
TokenShard readTokenShard(const std::string& path);

// A shard mapped read-only into memory (mmap) rather than read: the processes and readers of a
// run share its pages through the page cache and copy only the sequences they read, so that a
// corpus of billions of tokens (llm.c's FineWeb shards) trains without being held in memory.
// The same refusals as readTokenShard for its header and size, from the file's first 1 KiB and
// its status. (A shard cut short while mapped faults the reader that touches the lost pages:
// shards are not rewritten during a run.)
class MappedTokenShard {
 public:
  explicit MappedTokenShard(const std::string& path);
  ~MappedTokenShard();
  MappedTokenShard(const MappedTokenShard&) = delete;
  MappedTokenShard& operator=(const MappedTokenShard&) = delete;

  const std::string& path() const { return path_; }
  int tokenBytes() const { return token_bytes_; }
  std::int64_t size() const { return count_; }
  // Tokens [begin, begin + count) widened to 32 bits, into out.
  void copy(std::int64_t begin, std::int64_t count, std::uint32_t* out) const;

 private:
  std::string path_;
  void* map_ = nullptr;
  std::size_t bytes_ = 0;
  int token_bytes_ = 2;
  std::int64_t count_ = 0;
};

// Writes `tokens` as a shard at `path`: GPT-2's layout when every token fits 16 bits, Llama 3's
// otherwise. Written to PATH.tmp and renamed, so that a failed write leaves no shard behind.
// IoError naming the file.
void writeTokenShard(const std::string& path, std::span<const std::uint32_t> tokens);

// One token per byte of `text` (its value, 0..255): byte-level tokens.
std::vector<std::uint32_t> byteTokens(std::string_view text);

// The shards of `split` ("train" or "val") in folder `dir`: the .bin files whose name holds
// "_<split>" (llm.c's names: tiny_shakespeare_val.bin, fineweb_train_000001.bin), sorted by name.
// InputError naming the folder when there are none.
std::vector<std::string> tokenShardsIn(const std::string& dir, const std::string& split);

}  // namespace troupe::data
