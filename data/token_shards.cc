#include "data/token_shards.h"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <bit>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "data/files.h"
#include "troupe/error.h"

namespace troupe::data {
namespace {

namespace fs = std::filesystem;

static_assert(std::endian::native == std::endian::little, "shards are little-endian");

constexpr std::size_t kHeaderBytes = kShardHeaderInts * sizeof(std::int32_t);

}  // namespace

TokenShard readTokenShard(const std::string& path) {
  const std::string bytes = readRegularFile(path, "token shard");
  if (bytes.size() < kHeaderBytes) {
    throw InputError(fmt::format("token shard '{}' is {} bytes, shorter than its {}-byte header",
                                 path, bytes.size(), kHeaderBytes));
  }
  std::array<std::int32_t, 3> header{};
  std::memcpy(header.data(), bytes.data(), sizeof(header));
  TokenShard shard;
  shard.path = path;
  if (header[0] == kGpt2ShardMagic && header[1] == 1) {
    shard.token_bytes = 2;
  } else if (header[0] == kLlama3ShardMagic && header[1] == 7) {
    shard.token_bytes = 4;
  } else {
    throw InputError(fmt::format(
        "token shard '{}': magic {} version {} is not llm.c's (GPT-2's: {} version 1; Llama 3's: "
        "{} version 7)",
        path, header[0], header[1], kGpt2ShardMagic, kLlama3ShardMagic));
  }
  const std::int64_t count = header[2];
  const std::uint64_t expected =
      kHeaderBytes + static_cast<std::uint64_t>(std::max<std::int64_t>(count, 0)) *
                         static_cast<std::uint64_t>(shard.token_bytes);
  if (count < 0 || bytes.size() != expected) {
    throw InputError(fmt::format(
        "token shard '{}' is {} bytes; its header says {} tokens of {} bytes, {} bytes in all "
        "(a truncated or damaged file)",
        path, bytes.size(), count, shard.token_bytes, expected));
  }
  shard.tokens.resize(static_cast<std::size_t>(count));
  const char* at = bytes.data() + kHeaderBytes;
  if (shard.tokens.empty()) {
    // nothing to copy (an empty vector's data() may be null, which memcpy may not take)
  } else if (shard.token_bytes == 4) {
    std::memcpy(shard.tokens.data(), at, shard.tokens.size() * 4);
  } else {
    for (std::size_t i = 0; i < shard.tokens.size(); ++i) {
      std::uint16_t t;
      std::memcpy(&t, at + 2 * i, 2);
      shard.tokens[i] = t;
    }
  }
  return shard;
}

void writeTokenShard(const std::string& path, std::span<const std::uint32_t> tokens) {
  if (tokens.size() > static_cast<std::size_t>(INT32_MAX)) {
    throw InputError(fmt::format("token shard '{}': {} tokens, over the {} a header counts", path,
                                 tokens.size(), INT32_MAX));
  }
  const bool wide = std::any_of(tokens.begin(), tokens.end(), [](auto t) { return t > 0xFFFF; });
  std::array<std::int32_t, kShardHeaderInts> header{};
  header[0] = wide ? kLlama3ShardMagic : kGpt2ShardMagic;
  header[1] = wide ? 7 : 1;
  header[2] = static_cast<std::int32_t>(tokens.size());
  std::string bytes(kHeaderBytes + tokens.size() * (wide ? 4 : 2), '\0');
  std::memcpy(bytes.data(), header.data(), kHeaderBytes);
  char* at = bytes.data() + kHeaderBytes;
  if (wide) {  // not empty: a wide token is in it
    std::memcpy(at, tokens.data(), tokens.size() * 4);
  } else {
    for (std::size_t i = 0; i < tokens.size(); ++i) {
      const auto t = static_cast<std::uint16_t>(tokens[i]);
      std::memcpy(at + 2 * i, &t, 2);
    }
  }
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    out.close();
    if (!out) {
      std::error_code ec;
      fs::remove(tmp, ec);
      throw IoError(fmt::format("cannot write token shard '{}'", tmp));
    }
  }
  std::error_code ec;
  fs::rename(tmp, path, ec);
  if (ec) {
    fs::remove(tmp, ec);
    throw IoError(fmt::format("cannot rename '{}' to '{}': {}", tmp, path, ec.message()));
  }
}

std::vector<std::uint32_t> byteTokens(std::string_view text) {
  std::vector<std::uint32_t> tokens(text.size());
  std::transform(text.begin(), text.end(), tokens.begin(),
                 [](char c) { return static_cast<std::uint8_t>(c); });
  return tokens;
}

std::vector<std::string> tokenShardsIn(const std::string& dir, const std::string& split) {
  std::error_code ec;
  std::vector<std::string> shards;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();
    if (entry.path().extension() == ".bin" && name.find("_" + split) != std::string::npos)
      shards.push_back(entry.path().string());
  }
  if (ec) throw InputError(fmt::format("token shards: cannot list '{}': {}", dir, ec.message()));
  if (shards.empty()) {
    throw InputError(
        fmt::format("token shards: no {} shard (*_{}*.bin) in '{}'", split, split, dir));
  }
  std::sort(shards.begin(), shards.end());
  return shards;
}

}  // namespace troupe::data
