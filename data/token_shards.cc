#include "data/token_shards.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <bit>
#include <cerrno>
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

struct Layout {
  int token_bytes = 2;
  std::int64_t count = 0;
};

// The layout a shard's header gives, checked against the file's size; InputError naming the file
// and what is wrong. `head` holds the file's first bytes (all of them, or at least the header's).
Layout layoutOf(const std::string& path, const char* head, std::uint64_t size) {
  if (size < kHeaderBytes) {
    throw InputError(fmt::format("token shard '{}' is {} bytes, shorter than its {}-byte header",
                                 path, size, kHeaderBytes));
  }
  std::array<std::int32_t, 3> header{};
  std::memcpy(header.data(), head, sizeof(header));
  Layout layout;
  if (header[0] == kGpt2ShardMagic && header[1] == 1) {
    layout.token_bytes = 2;
  } else if (header[0] == kLlama3ShardMagic && header[1] == 7) {
    layout.token_bytes = 4;
  } else {
    throw InputError(fmt::format(
        "token shard '{}': magic {} version {} is not llm.c's (GPT-2's: {} version 1; Llama 3's: "
        "{} version 7)",
        path, header[0], header[1], kGpt2ShardMagic, kLlama3ShardMagic));
  }
  layout.count = header[2];
  const std::uint64_t expected =
      kHeaderBytes + static_cast<std::uint64_t>(std::max<std::int64_t>(layout.count, 0)) *
                         static_cast<std::uint64_t>(layout.token_bytes);
  if (layout.count < 0 || size != expected) {
    throw InputError(fmt::format(
        "token shard '{}' is {} bytes; its header says {} tokens of {} bytes, {} bytes in all "
        "(a truncated or damaged file)",
        path, size, layout.count, layout.token_bytes, expected));
  }
  return layout;
}

// Tokens [0, count) of a shard's body `at` (token_bytes each), widened into out.
void widen(const char* at, int token_bytes, std::int64_t count, std::uint32_t* out) {
  if (count <= 0) return;  // (an empty vector's data() may be null, which memcpy may not take)
  if (token_bytes == 4) {
    std::memcpy(out, at, static_cast<std::size_t>(count) * 4);
    return;
  }
  for (std::int64_t i = 0; i < count; ++i) {
    std::uint16_t t;
    std::memcpy(&t, at + 2 * i, 2);
    out[i] = t;
  }
}

}  // namespace

TokenShard readTokenShard(const std::string& path) {
  const std::string bytes = readRegularFile(path, "token shard");
  const Layout layout = layoutOf(path, bytes.data(), bytes.size());
  TokenShard shard;
  shard.path = path;
  shard.token_bytes = layout.token_bytes;
  shard.tokens.resize(static_cast<std::size_t>(layout.count));
  widen(bytes.data() + kHeaderBytes, layout.token_bytes, layout.count, shard.tokens.data());
  return shard;
}

MappedTokenShard::MappedTokenShard(const std::string& path) : path_(path) {
  checkRegularFile(path, "token shard");
  const int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC | O_NOCTTY);
  if (fd < 0) {
    throw InputError(fmt::format("cannot open token shard '{}': {}", path, std::strerror(errno)));
  }
  struct stat st {};
  const bool known = ::fstat(fd, &st) == 0;
  const auto size = static_cast<std::uint64_t>(known ? st.st_size : 0);
  char head[sizeof(std::int32_t) * 3] = {};
  if (known && size >= kHeaderBytes) {
    map_ = ::mmap(nullptr, static_cast<std::size_t>(size), PROT_READ, MAP_SHARED, fd, 0);
    if (map_ == MAP_FAILED) map_ = nullptr;
  }
  const int error = errno;
  ::close(fd);
  if (!known || (size >= kHeaderBytes && !map_)) {
    throw InputError(fmt::format("cannot map token shard '{}': {}", path, std::strerror(error)));
  }
  bytes_ = static_cast<std::size_t>(size);
  if (map_) std::memcpy(head, map_, sizeof head);
  try {
    const Layout layout = layoutOf(path, head, size);
    token_bytes_ = layout.token_bytes;
    count_ = layout.count;
  } catch (...) {
    if (map_) ::munmap(map_, bytes_);
    throw;
  }
}

MappedTokenShard::~MappedTokenShard() {
  if (map_) ::munmap(map_, bytes_);
}

void MappedTokenShard::copy(std::int64_t begin, std::int64_t count, std::uint32_t* out) const {
  TROUPE_ENFORCE(begin >= 0 && count >= 0 && begin + count <= count_, "tokens [", begin, ", ",
                 begin + count, ") of a shard of ", count_);
  widen(static_cast<const char*>(map_) + kHeaderBytes + begin * token_bytes_, token_bytes_, count,
        out);
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
