#include "transport/shared_arena.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <random>

#include "troupe/error.h"

namespace troupe::transport {
namespace {

constexpr std::uint64_t kArenaMagic = 0x414e455241505254ull;  // "TRPARENA"
constexpr std::uint32_t kBlockMagic = 0x4b4c4254u;            // "TBLK"
constexpr std::size_t kAlign = 64;
constexpr std::size_t kArenaHeaderBytes = 64;

struct ArenaHeader {
  std::uint64_t magic;
  std::uint64_t token;
  std::uint64_t bytes;
};

// Precedes every allocation; `refs` is shared between processes (atomic_ref on both sides).
struct alignas(kAlign) BlockHeader {
  std::uint32_t magic;
  std::uint32_t refs;
  std::uint64_t bytes;  // data bytes after this header
};
static_assert(sizeof(BlockHeader) == kAlign);
static_assert(std::atomic_ref<std::uint32_t>::is_always_lock_free);

std::atomic_ref<std::uint32_t> refsOf(BlockHeader* header) {
  return std::atomic_ref<std::uint32_t>(header->refs);
}

std::size_t roundUp(std::size_t n, std::size_t to) {
  return (n + to - 1) / to * to;
}

}  // namespace

std::shared_ptr<SharedArena> SharedArena::create(std::size_t bytes, std::string* why) {
  const auto page = static_cast<std::size_t>(sysconf(_SC_PAGESIZE));
  bytes = roundUp(std::max<std::size_t>(bytes, 2 * page), page);
  std::shared_ptr<SharedArena> arena(new SharedArena());
  arena->fd_ = memfd_create("troupe-arena", MFD_CLOEXEC);
  if (arena->fd_ < 0) {
    *why = fmt::format("memfd_create: {}", std::strerror(errno));
    return nullptr;
  }
  if (ftruncate(arena->fd_, static_cast<off_t>(bytes)) != 0) {
    *why = fmt::format("ftruncate to {} bytes: {}", bytes, std::strerror(errno));
    return nullptr;
  }
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, arena->fd_, 0);
  if (p == MAP_FAILED) {
    *why = fmt::format("mmap of {} bytes: {}", bytes, std::strerror(errno));
    return nullptr;
  }
  arena->base_ = static_cast<std::byte*>(p);
  arena->bytes_ = bytes;
  arena->path_ = fmt::format("/proc/{}/fd/{}", getpid(), arena->fd_);
  std::random_device random;
  arena->token_ = (std::uint64_t{random()} << 32) ^ random();
  const ArenaHeader header{kArenaMagic, arena->token_, bytes};
  std::memcpy(arena->base_, &header, sizeof header);
  return arena;
}

SharedArena::~SharedArena() {
  if (base_) munmap(base_, bytes_);
  if (fd_ >= 0) close(fd_);
}

void SharedArena::reclaim() {
  while (!live_.empty()) {
    auto* header = reinterpret_cast<BlockHeader*>(base_ + live_.front().offset);
    if (refsOf(header).load(std::memory_order_acquire) != 0) return;
    live_.pop_front();
  }
}

std::shared_ptr<std::byte> SharedArena::allocate(std::size_t bytes) {
  const std::size_t need = sizeof(BlockHeader) + roundUp(std::max<std::size_t>(bytes, 1), kAlign);
  const std::size_t first = kArenaHeaderBytes, end = bytes_;
  std::size_t at = 0;
  {
    std::lock_guard lock(mutex_);
    reclaim();
    if (live_.empty()) {
      if (first + need > end) return nullptr;
      at = first;
    } else {
      // Live blocks occupy [front, back end) going round the ring once.
      const std::size_t front = live_.front().offset;
      const std::size_t backEnd = live_.back().offset + live_.back().bytes;
      if (backEnd > front) {  // not wrapped: room after the back, else at the start
        if (backEnd + need <= end) {
          at = backEnd;
        } else if (first + need <= front) {
          at = first;
        } else {
          return nullptr;
        }
      } else if (backEnd + need <= front) {  // wrapped: room between back and front
        at = backEnd;
      } else {
        return nullptr;
      }
    }
    live_.push_back({at, need});
  }
  auto* header = reinterpret_cast<BlockHeader*>(base_ + at);
  header->magic = kBlockMagic;
  header->bytes = need - sizeof(BlockHeader);
  refsOf(header).store(1, std::memory_order_release);
  return std::shared_ptr<std::byte>(base_ + at + sizeof(BlockHeader),
                                    [arena = shared_from_this(), header](std::byte*) {
                                      refsOf(header).fetch_sub(1, std::memory_order_release);
                                    });
}

std::optional<std::uint64_t> SharedArena::share(const void* data, std::size_t bytes) {
  const auto* p = static_cast<const std::byte*>(data);
  if (p < base_ + kArenaHeaderBytes + sizeof(BlockHeader) || p >= base_ + bytes_) {
    return std::nullopt;
  }
  const auto offset = static_cast<std::size_t>(p - base_);
  if (offset % kAlign != 0) return std::nullopt;
  auto* header = reinterpret_cast<BlockHeader*>(base_ + offset - sizeof(BlockHeader));
  if (header->magic != kBlockMagic || header->bytes < bytes) return std::nullopt;
  // The caller holds a tensor of this block, so its count is above zero and stays so.
  if (refsOf(header).fetch_add(1, std::memory_order_relaxed) == 0) {
    refsOf(header).fetch_sub(1, std::memory_order_relaxed);
    return std::nullopt;
  }
  return offset;
}

std::size_t SharedArena::liveBlocks() {
  std::lock_guard lock(mutex_);
  reclaim();
  return live_.size();
}

std::shared_ptr<PeerArena> PeerArena::open(const std::string& path, std::uint64_t token,
                                           std::uint64_t bytes) {
  const int fd = ::open(path.c_str(), O_RDWR | O_CLOEXEC);
  if (fd < 0) {
    throw IoError(fmt::format("cannot open the shared arena {}: {}", path, std::strerror(errno)));
  }
  struct stat st {};
  const bool sized = fstat(fd, &st) == 0 && static_cast<std::uint64_t>(st.st_size) == bytes;
  void* p = sized ? mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0) : MAP_FAILED;
  const int mapError = errno;
  ::close(fd);  // the mapping keeps the memory
  if (!sized) {
    throw InputError(fmt::format("the shared arena {} is not {} bytes long", path, bytes));
  }
  if (p == MAP_FAILED) {
    throw IoError(fmt::format("cannot map the shared arena {}: {}", path, std::strerror(mapError)));
  }
  std::shared_ptr<PeerArena> arena(new PeerArena());
  arena->base_ = static_cast<std::byte*>(p);
  arena->bytes_ = bytes;
  ArenaHeader header{};
  std::memcpy(&header, arena->base_, sizeof header);
  if (header.magic != kArenaMagic || header.token != token || header.bytes != bytes) {
    throw InputError(fmt::format("{} is not the shared arena its peer announced", path));
  }
  return arena;
}

PeerArena::~PeerArena() {
  if (base_) munmap(base_, bytes_);
}

std::shared_ptr<const std::byte> PeerArena::take(std::uint64_t offset, std::uint64_t bytes) {
  if (offset < kArenaHeaderBytes + sizeof(BlockHeader) || offset % kAlign != 0 || offset > bytes_ ||
      bytes > bytes_ - offset) {
    throw InputError(
        fmt::format("a shared part at {} of {} bytes lies outside the peer's arena "
                    "of {} bytes",
                    offset, bytes, bytes_));
  }
  auto* header = reinterpret_cast<BlockHeader*>(base_ + offset - sizeof(BlockHeader));
  if (header->magic != kBlockMagic || header->bytes < bytes ||
      refsOf(header).load(std::memory_order_acquire) == 0) {
    throw InputError(fmt::format(
        "a shared part at {} of {} bytes is not a live block of the peer's arena", offset, bytes));
  }
  return std::shared_ptr<const std::byte>(base_ + offset,
                                          [arena = shared_from_this(), header](const std::byte*) {
                                            refsOf(header).fetch_sub(1, std::memory_order_release);
                                          });
}

}  // namespace troupe::transport
