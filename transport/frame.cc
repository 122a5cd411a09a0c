#include "transport/frame.h"

#include <fmt/format.h>

#include <cstring>

#include "troupe/error.h"

namespace troupe::transport {

namespace {

template <typename T>
void put(std::array<std::byte, kFrameHeaderBytes>& out, std::size_t at, T value) {
  std::memcpy(out.data() + at, &value, sizeof(T));
}

template <typename T>
T get(const std::byte* bytes, std::size_t at) {
  T value;
  std::memcpy(&value, bytes + at, sizeof(T));
  return value;
}

}  // namespace

std::array<std::byte, kFrameHeaderBytes> encodeFrameHeader(const FrameHeader& header) {
  std::array<std::byte, kFrameHeaderBytes> out{};
  put(out, 0, kFrameMagic);
  put(out, 4, static_cast<std::uint8_t>(header.kind));
  put(out, 5, kFrameVersion);
  put(out, 8, header.count);
  put(out, 16, header.bytes);
  put(out, 24, header.offset);
  return out;
}

FrameHeader decodeFrameHeader(const std::byte* bytes, std::size_t maxFrameBytes) {
  const auto magic = get<std::uint32_t>(bytes, 0);
  if (magic != kFrameMagic) {
    throw InputError(fmt::format("bad frame magic 0x{:08x} (garbage or not a troupe peer)", magic));
  }
  const auto version = get<std::uint8_t>(bytes, 5);
  if (version != kFrameVersion) {
    throw InputError("frame version " + std::to_string(version) + ", expected " +
                     std::to_string(kFrameVersion));
  }
  FrameHeader header;
  const auto kind = get<std::uint8_t>(bytes, 4);
  if (kind != static_cast<std::uint8_t>(FrameKind::kMessage) &&
      kind != static_cast<std::uint8_t>(FrameKind::kBulk)) {
    throw InputError("unknown frame kind " + std::to_string(kind));
  }
  if (get<std::uint16_t>(bytes, 6) != 0 || get<std::uint32_t>(bytes, 12) != 0) {
    throw InputError("nonzero reserved frame header bytes");
  }
  header.kind = static_cast<FrameKind>(kind);
  header.count = get<std::uint32_t>(bytes, 8);
  header.bytes = get<std::uint64_t>(bytes, 16);
  header.offset = get<std::uint64_t>(bytes, 24);
  std::uint64_t frameBytes = kFrameHeaderBytes + header.bytes;
  if (header.kind == FrameKind::kMessage) {
    if (header.count == 0 || header.count > kMaxSegments) {
      throw InputError("malformed segment table: " + std::to_string(header.count) +
                       " segments (1.." + std::to_string(kMaxSegments) + " allowed)");
    }
    if (header.bytes % 8 != 0 || header.offset != 0) {
      throw InputError("malformed message frame header: " + std::to_string(header.bytes) +
                       " bytes at offset " + std::to_string(header.offset));
    }
    frameBytes += segmentTableBytes(header.count);
  } else if (header.bytes == 0) {
    throw InputError("empty bulk chunk");
  }
  if (header.bytes > maxFrameBytes || frameBytes > maxFrameBytes) {
    throw InputError("frame of " + std::to_string(header.bytes) +
                     " bytes announced, over the frame limit of " + std::to_string(maxFrameBytes));
  }
  return header;
}

}  // namespace troupe::transport
