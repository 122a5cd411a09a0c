// The byte format on a link. Every frame starts with a 32-byte little-endian header:
//
//   offset size  field
//   0      4     magic   0x46505254 ("TRPF")
//   4      1     kind    1 = message, 2 = bulk chunk
//   5      1     version 1
//   6      2     zero
//   8      4     count   message: segment count (1..kMaxSegments); bulk: part index
//   12     4     zero
//   16     8     bytes   message: total segment bytes; bulk: chunk bytes
//   24     8     offset  message: 0; bulk: byte offset of the chunk in its part
//
// A message frame goes on with its segment table (count x uint32 segment sizes in words, zero
// padded to 8 bytes) and the segments back to back: a Cap'n Proto message whose root is a
// wire::Frame. A frame whose Frame.bulk lists N part sizes is followed at once, on the same link,
// by the bulk chunks of part 0, 1, ... in order (each chunk: the header, then `bytes` raw bytes).
// header + table + segments, and a chunk's header + bytes, never exceed the frame limit.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>

namespace troupe::transport {

inline constexpr std::uint32_t kFrameMagic = 0x46505254u;
inline constexpr std::uint8_t kFrameVersion = 1;
inline constexpr std::size_t kFrameHeaderBytes = 32;
inline constexpr std::uint32_t kMaxSegments = 512;

enum class FrameKind : std::uint8_t { kMessage = 1, kBulk = 2 };

struct FrameHeader {
  FrameKind kind = FrameKind::kMessage;
  std::uint32_t count = 0;
  std::uint64_t bytes = 0;
  std::uint64_t offset = 0;
};

std::array<std::byte, kFrameHeaderBytes> encodeFrameHeader(const FrameHeader& header);

// Parses and checks a header against the frame limit; a bad one throws InputError saying why.
FrameHeader decodeFrameHeader(const std::byte* bytes, std::size_t maxFrameBytes);

// Bytes of the segment table of a message with `segments` segments (padded to 8).
inline std::size_t segmentTableBytes(std::uint32_t segments) {
  return (static_cast<std::size_t>(segments) * 4 + 7) / 8 * 8;
}

}  // namespace troupe::transport
