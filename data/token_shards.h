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
