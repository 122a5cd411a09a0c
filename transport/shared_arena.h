// Memory shared with the peers on this host, so that large tensors between processes of one
// machine cross no socket: the sender writes a tensor once into its arena, the message carries
// (offset, bytes), and the receiver reads the tensor in place through its own mapping of the
// sender's arena. One copy in all, where a socket costs two (into the kernel and out of it).
//
// The arena is a memfd, which the kernel frees when the last process mapping it goes (a killed run
// leaves nothing behind in /dev/shm); peers open it through /proc/<pid>/fd/<fd>. Peers that cannot
// (another pid namespace or user) are sent bytes over the socket instead.
// Each allocation starts with a 64-byte header holding a reference count that lives in the shared
// memory: one reference for the sender's tensor and one per message carrying it, which the
// receiver drops when the message's last view goes. The sender reuses memory in allocation order
// as the oldest allocations' counts reach zero; when the arena is full, allocate() returns null and
// callers use ordinary memory. A reference a receiver never drops (it died, or the link closed
// with the message unread) keeps its block, and those after it, from reuse: memory is lost to
// the arena, never handed out twice.
// Thread safety: all methods, any thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <string>

namespace troupe::transport {

class SharedArena : public std::enable_shared_from_this<SharedArena> {
 public:
  // An arena of `bytes` (rounded up to pages), or null with the reason in *why.
  static std::shared_ptr<SharedArena> create(std::size_t bytes, std::string* why);
  ~SharedArena();
  SharedArena(const SharedArena&) = delete;
  SharedArena& operator=(const SharedArena&) = delete;

  const std::string& path() const { return path_; }  // what a peer opens
  std::uint64_t token() const { return token_; }     // random; a peer checks its mapping has it
  std::size_t bytes() const { return bytes_; }

  // `bytes` of arena memory, 64-byte aligned, uninitialised, holding the sender's reference; null
  // if there is no room now.
  std::shared_ptr<std::byte> allocate(std::size_t bytes);
  // If `data` is the start of an allocation of at least `bytes`: adds a reference for one
  // receiver and returns the data's offset in the arena.
  std::optional<std::uint64_t> share(const void* data, std::size_t bytes);
  // Allocations not yet reused (for tests).
  std::size_t liveBlocks();

 private:
  SharedArena() = default;
  void reclaim();  // mutex_ held

  std::string path_;
  std::uint64_t token_ = 0;
  std::size_t bytes_ = 0;
  int fd_ = -1;
  std::byte* base_ = nullptr;

  struct Block {
    std::size_t offset;  // of the header
    std::size_t bytes;   // header included
  };
  std::mutex mutex_;
  std::deque<Block> live_;  // in allocation order
};

// A peer's arena, mapped here for reading the tensors it shares.
class PeerArena : public std::enable_shared_from_this<PeerArena> {
 public:
  // Throws IoError if `path` cannot be opened or mapped, InputError if it is not an arena of
  // `bytes` bytes holding `token`.
  static std::shared_ptr<PeerArena> open(const std::string& path, std::uint64_t token,
                                         std::uint64_t bytes);
  ~PeerArena();
  PeerArena(const PeerArena&) = delete;
  PeerArena& operator=(const PeerArena&) = delete;

  // The `bytes` shared at `offset`, holding one reference until the returned pointer's last copy
  // goes. Throws InputError if they are not inside one live allocation.
  std::shared_ptr<const std::byte> take(std::uint64_t offset, std::uint64_t bytes);

 private:
  PeerArena() = default;
  std::size_t bytes_ = 0;
  std::byte* base_ = nullptr;
};

}  // namespace troupe::transport
