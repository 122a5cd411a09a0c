// libFuzzer target: the bytes one link receives, taken as the transport's reading side takes them
// (Connection::onHeader .. onBulk in transport/asio/asio_transport.cc): frame headers, segment
// tables, segments parsed within TransportOptions' reader limits, bulk chunks. Every complete
// message is then read as actors/wire_codec.cc's decodeMessage reads it, each tensor field as a
// view whose bytes are all touched. A Hello may come at any point (the link's rule that it comes
// first is left out, so that inputs need not start with one). Bad input may only throw
// troupe::Error; anything else (a crash, another exception, a sanitizer report) is a finding.
#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <numeric>
#include <type_traits>

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

void readMessage(const IncomingMessage& in) {
  using W = wire::Frame;
  const auto f = in.frame();
  use(f.getTarget(), f.getSourceActor());
  switch (f.which()) {
    case W::GRAD_BUCKET: {
      auto r = f.getGradBucket();
      use(r.getStep(), r.getReplica(), r.getBegin(), r.getEnd());
      touch(in, r.getGrads());
      break;
    }
    case W::REDUCED: {
      auto r = f.getReduced();
      use(r.getStep(), r.getBegin(), r.getEnd());
      touch(in, r.getGrads());
      break;
    }
    case W::WEIGHTS: {
      auto r = f.getWeights();
      use(r.getStep());
      touch(in, r.getWeights());
      touch(in, r.getBuffers());
      break;
    }
    case W::STEP_DONE: {
      auto r = f.getStepDone();
      use(r.getStep(), r.getReplica(), r.getLossSum(), r.getCorrect(), r.getCount());
      break;
    }
    case W::EPOCH_END: {
      auto r = f.getEpochEnd();
      use(r.getStep());
      touch(in, r.getWeights());
      touch(in, r.getMomentum());
      break;
    }
    case W::EVALUATE: {
      auto r = f.getEvaluate();
      use(r.getEpoch());
      touch(in, r.getWeights());
      touch(in, r.getBuffers());
      break;
    }
    case W::EVALUATED: {
      auto r = f.getEvaluated();
      use(r.getReplica(), r.getLossSum(), r.getCorrect(), r.getCount());
      break;
    }
    case W::BUFFERS:
      touch(in, f.getBuffers().getBuffers());
      break;
    case W::ALLREDUCE_CHUNK: {
      auto r = f.getAllreduceChunk();
      use(r.getOpId(), r.getStep(), r.getBucketBegin(), r.getChunkIndex(), r.getOffset(),
          r.getSegment(), r.getRound());
      use(r.getPhase() == wire::AllreduceChunk::Phase::REDUCE_SCATTER);
      touch(in, r.getData());
      break;
    }
    case W::PUSH: {
      auto r = f.getPush();
      use(r.getStep(), r.getWorker(), r.getKeyBegin(), r.getKeyEnd());
      touch(in, r.getData());
      break;
    }
    case W::PULL: {
      auto r = f.getPull();
      use(r.getStep(), r.getWorker(), r.getKeyBegin(), r.getKeyEnd(), r.getEpochEnd());
      break;
    }
    case W::PULL_REPLY: {
      auto r = f.getPullReply();
      use(r.getStep(), r.getKeyBegin(), r.getKeyEnd());
      touch(in, r.getData());
      touch(in, r.getState());
      break;
    }
    default:  // resume, buffersRequest, shutdown carry nothing; none is refused by the decoder
      break;
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
