// libFuzzer target: the bytes one link receives, taken as the transport's reading side takes them
// (Connection::onHeader .. onBulk in transport/asio/asio_transport.cc): frame headers, segment
// tables, segments parsed within TransportOptions' reader limits, bulk chunks. Every field of every
// complete message is then read through the schema (walk), each tensor field as a view whose
// bytes are all touched, and decoded as the actors take it (actors::decodeMessage). A Hello may
// come at any point (the link's rule that it comes first is left out, so that inputs need not start
// with one). Bad input may only throw troupe::Error; anything else (a crash, another exception, a
// sanitizer report) is a finding.
#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <numeric>
#include <type_traits>

#include <capnp/dynamic.h>
#include <capnp/schema.h>

#include "actors/core/wire_codec.h"
#include "transport/frame.h"
#include "transport/message_state.h"
#include "troupe/error.h"

namespace {

using namespace troupe::transport;

// The input, taken in the pieces a link reads.
class Stream {
 public:
  Stream(const std::uint8_t* data, std::size_t size)
      : data_(reinterpret_cast<const std::byte*>(data)), size_(size) {}

  // The next n bytes, or null where the input ends first (the peer closed mid-frame).
  const std::byte* take(std::size_t n) {
    if (n > size_ - at_) return nullptr;
    const std::byte* p = data_ + at_;
    at_ += n;
    return p;
  }
  std::size_t left() const { return size_ - at_; }

 private:
  const std::byte* data_;
  std::size_t size_;
  std::size_t at_ = 0;
};

volatile std::uint64_t sink;

// Reads values so that they are not optimised away.
template <typename... T>
void use(T... values) {
  auto bits = [](auto v) {
    if constexpr (std::is_floating_point_v<decltype(v)>) {
      return std::bit_cast<std::uint64_t>(static_cast<double>(v));
    } else {
      return static_cast<std::uint64_t>(v);
    }
  };
  sink = sink + (... + bits(values));
}

// Views a tensor field as the actors do, and reads every byte of the view.
void touch(const IncomingMessage& message, wire::TensorData::Reader data) {
  const auto tensor = message.tensor(data);
  const auto* bytes = static_cast<const std::uint8_t*>(tensor.raw());
  std::uint64_t sum = 0;
  for (std::size_t i = 0; i < tensor.bytes(); ++i)
    sum += bytes[i];
  use(sum);
}

// Every field of a message, whatever its type, through its schema (Cap'n Proto's dynamic API): the
// walk follows wire.capnp itself, so a message or field added there is read here too. A
// TensorData is viewed as the actors view it.
void walk(const IncomingMessage& in, capnp::DynamicValue::Reader value);

void walkStruct(const IncomingMessage& in, capnp::DynamicStruct::Reader s) {
  if (s.getSchema() == capnp::Schema::from<wire::TensorData>()) {
    touch(in, s.as<wire::TensorData>());
    return;
  }
  for (const auto field : s.getSchema().getFields()) {
    if (s.has(field)) walk(in, s.get(field));  // a union's other members are not there
  }
}

void walk(const IncomingMessage& in, capnp::DynamicValue::Reader value) {
  switch (value.getType()) {
    case capnp::DynamicValue::STRUCT:
      walkStruct(in, value.as<capnp::DynamicStruct>());
      break;
    case capnp::DynamicValue::LIST:
      for (const auto element : value.as<capnp::DynamicList>())
        walk(in, element);
      break;
    case capnp::DynamicValue::TEXT:
      use(std::strlen(value.as<capnp::Text>().cStr()));
      break;
    case capnp::DynamicValue::DATA: {
      std::uint64_t sum = 0;
      for (const auto byte : value.as<capnp::Data>())
        sum += byte;
      use(sum);
      break;
    }
    case capnp::DynamicValue::INT:
      use(value.as<std::int64_t>());
      break;
    case capnp::DynamicValue::UINT:
      use(value.as<std::uint64_t>());
      break;
    case capnp::DynamicValue::FLOAT:
      use(value.as<double>());
      break;
    case capnp::DynamicValue::BOOL:
      use(value.as<bool>());
      break;
    case capnp::DynamicValue::ENUM:
      use(value.as<capnp::DynamicEnum>().getRaw());
      break;
    default:  // void, capabilities (none in wire.capnp)
      break;
  }
}

// Every field through the schema, then the message as the actors take it (wire_codec.h), which
// may refuse it with an InputError.
void readMessage(const IncomingMessage& in) {
  walkStruct(in, capnp::toDynamic(in.frame()));
  try {
    const auto decoded = troupe::actors::decodeMessage(1, in);
    use(decoded.target);
  } catch (const troupe::InputError&) {
  }
}

void readHello(wire::Hello::Reader hello) {
  use(hello.getNode(), std::strlen(hello.getRunId().cStr()), hello.getAddress().size(),
      std::strlen(hello.getIncarnation().cStr()));
}

void receive(Stream& in) {
  static const TransportOptions options;
  // No buffers kept for reuse: each is freed at once, so that ASan sees any use after its message.
  static const auto pool = std::make_shared<BufferPool>(0);
  PendingBulk bulk;
  while (const std::byte* headerBytes = in.take(kFrameHeaderBytes)) {
    const FrameHeader header = decodeFrameHeader(headerBytes, options.maxFrameBytes);
    if (header.kind == FrameKind::kBulk) {
      std::byte* into = bulkChunkTarget(bulk, header);
      const std::byte* bytes = in.take(header.bytes);
      if (!bytes) return;
      std::memcpy(into, bytes, header.bytes);
      if (auto complete = advanceBulk(bulk, header.bytes)) readMessage(IncomingMessage(complete));
      continue;
    }
    if (bulk.message) return;  // a message frame while bulk parts are pending drops the link
    const std::byte* table = in.take(segmentTableBytes(header.count));
    if (!table) return;
    auto state = startMessage(header, table, *pool);
    const std::byte* segments = in.take(header.bytes);
    if (!segments) return;
    std::memcpy(state->buffer.get(), segments, header.bytes);
    parseMessage(*state, options);
    const auto frame = state->reader->getRoot<wire::Frame>();
    if (frame.isHello()) {
      readHello(frame.getHello());
    } else if (frame.isRefusal()) {
      use(std::strlen(frame.getRefusal().cStr()));
    } else if (frame.getBulk().size() == 0) {
      readMessage(IncomingMessage(state));
    } else {
      planBulkParts(*state, options);
      // Parts longer than the rest of the input never arrive; the link would wait for them.
      const auto announced =
          std::accumulate(state->partSizes.begin(), state->partSizes.end(), std::uint64_t{0});
      if (announced > in.left()) return;
      state->bulk = pool->allocate(state->bulkBytes);
      bulk = {std::move(state)};
      if (auto complete = advanceBulk(bulk, 0)) readMessage(IncomingMessage(complete));
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  Stream in(data, size);
  try {
    receive(in);
  } catch (const troupe::Error&) {
    // What the link reports before it drops the peer.
  }
  return 0;
}
