// Inside the transport: what messages hold, and how a message becomes bytes on a link.
#pragma once

#include <capnp/message.h>
#include <capnp/serialize.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <span>
#include <vector>

#include "kernels/tensor.h"
#include "transport/frame.h"
#include "transport/message.h"
#include "transport/options.h"

namespace troupe::transport {

class SharedArena;

struct OutgoingMessage::State {
  static constexpr unsigned kFirstSegmentWords = 256;
  capnp::MallocMessageBuilder builder{kFirstSegmentWords};
  struct Pending {
    wire::TensorData::Builder slot;
    kernels::Tensor tensor;
  };
  std::vector<Pending> pending;
  // Filled by encodeMessage: the tensors the message points at (inline or bulk).
  std::vector<kernels::Tensor> tensors;
};

struct IncomingMessage::State {
  std::shared_ptr<std::byte> buffer;  // the segments, back to back, 64-byte aligned
  std::size_t bufferBytes = 0;
  std::vector<kj::ArrayPtr<const capnp::word>> segments;
  std::unique_ptr<capnp::SegmentArrayMessageReader> reader;
  std::shared_ptr<std::byte> bulk;  // the bulk parts, each 64-byte aligned
  std::size_t bulkBytes = 0;
  std::vector<std::size_t> partOffsets;
  std::vector<std::size_t> partSizes;
  // Tensors in the sender's shared arena, each holding its reference (see shared_arena.h).
  std::vector<std::shared_ptr<const std::byte>> shared;
  std::vector<std::size_t> sharedSizes;
};

// 64-byte aligned, uninitialised; throws std::bad_alloc.
std::shared_ptr<std::byte> allocateAligned(std::size_t bytes);

// Receive buffers: freed ones of at least kMinPooledBytes are kept (up to `capacity` bytes in all)
// and handed out again for a request of half their size or more, which spares large messages the
// allocator and the page faults of fresh memory. Buffers may outlive the pool. Thread-safe.
class BufferPool : public std::enable_shared_from_this<BufferPool> {
 public:
  static constexpr std::size_t kMinPooledBytes = std::size_t{1} << 20;
  explicit BufferPool(std::size_t capacity) : capacity_(capacity) {}
  ~BufferPool();
  // 64-byte aligned, uninitialised; throws std::bad_alloc.
  std::shared_ptr<std::byte> allocate(std::size_t bytes);

 private:
  void release(std::byte* buffer, std::size_t bytes);

  const std::size_t capacity_;
  std::mutex mutex_;
  std::multimap<std::size_t, std::byte*> idle_;
  std::size_t idleBytes_ = 0;
};

struct EncodeLimits {
  std::size_t maxFrameBytes = 0;
  std::size_t inlineTensorBytes = 0;
  std::size_t bulkChunkBytes = 0;
};

// The frames of one message, ready for a gather write: `pieces` point into this object, the
// message's segments and its tensors; `state` keeps them alive.
struct EncodedMessage {
  std::shared_ptr<OutgoingMessage::State> state;
  std::deque<std::array<std::byte, kFrameHeaderBytes>> headers;
  std::vector<std::byte> table;
  std::vector<std::span<const std::byte>> pieces;
  std::size_t bytes = 0;
};

// Decides shared, inline or bulk for each pending tensor, fills Frame.shared and Frame.bulk and
// lays out the frames. A tensor that starts an allocation of `arena` (non-null when the receiver
// has mapped it) goes as a shared part. Throws InputError if the message without its tensors
// exceeds the frame limit.
EncodedMessage encodeMessage(std::shared_ptr<OutgoingMessage::State> state,
                             const EncodeLimits& limits, SharedArena* arena = nullptr);

// Receiving, step by step as a link's bytes arrive: a frame header (decodeFrameHeader); for a
// message frame its segment table (startMessage), then its segments (parseMessage) and, for a
// message that announces bulk parts (planBulkParts), their chunks (bulkChunkTarget, advanceBulk).
// Each step throws InputError saying what is malformed, and the link is dropped then.

// The segment table of a message frame whose header decodeFrameHeader returned: checks it against
// the header and returns a message whose buffer (from `pool`) awaits the header.bytes bytes of its
// segments. Throws std::bad_alloc if that buffer cannot be had.
std::shared_ptr<IncomingMessage::State> startMessage(const FrameHeader& header,
                                                     const std::byte* table, BufferPool& pool);

// The segments have arrived: parses them as a wire::Frame within options' reader limits
// (traversalLimitWords, nestingLimit) and reads every field once, so that no later read of the
// frame throws (a Text without its NUL, a pointer or list of the wrong kind are refused here).
void parseMessage(IncomingMessage::State& message, const TransportOptions& options);

// Lays out the bulk parts that a parsed message announces (partSizes, partOffsets, bulkBytes),
// refusing more than options.maxBulkBytes in all; the caller allocates `bulk`.
void planBulkParts(IncomingMessage::State& message, const TransportOptions& options);

// The bytes encodeMessage writes for `message` under `options`' limits, read back as a link reads
// one frame: what tests and benchmarks of the codec take instead of a link. InvariantError for a
// message with bulk parts (its tensors too large to travel inline).
IncomingMessage loopback(OutgoingMessage message, const TransportOptions& options = {});

// A message waiting for its bulk parts, and where the next chunk of them goes.
struct PendingBulk {
  std::shared_ptr<IncomingMessage::State> message;  // null: none pending
  std::size_t part = 0;
  std::size_t offset = 0;
};

// Where the bytes of the bulk chunk `chunk` go; throws InputError if no message waits for bulk
// parts or the chunk is not the one expected next.
std::byte* bulkChunkTarget(const PendingBulk& pending, const FrameHeader& chunk);

// `bytes` more bytes of the pending parts have arrived (0 right after planning, to pass empty
// parts). Returns the message once its last part is complete, and leaves `pending` empty.
std::shared_ptr<IncomingMessage::State> advanceBulk(PendingBulk& pending, std::size_t bytes);

}  // namespace troupe::transport
