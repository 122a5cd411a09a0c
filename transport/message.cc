#include <capnp/dynamic.h>
#include <capnp/schema.h>
#include <fmt/format.h>

#include <algorithm>
#include <bit>
#include <cstdlib>
#include <cstring>
#include <new>
#include <numeric>
#include <utility>

#include "transport/message_state.h"
#include "transport/shared_arena.h"
#include "troupe/error.h"

namespace troupe::transport {

static_assert(std::endian::native == std::endian::little,
              "the wire format carries tensors as little-endian bytes");

namespace {

constexpr std::byte kZeros[8] = {};

std::size_t wordsFor(std::size_t bytes) {
  return (bytes + 7) / 8;
}

// Reads every field the schema knows, as receivers read them: a pointer of the wrong kind, a list
// of the wrong element size or a Text without its NUL throws here, not where a field is read.
void readAllFields(capnp::DynamicValue::Reader value) {
  if (value.getType() == capnp::DynamicValue::STRUCT) {
    auto object = value.as<capnp::DynamicStruct>();
    for (auto field : object.getSchema().getFields()) {
      if (object.has(field)) readAllFields(object.get(field));
    }
  } else if (value.getType() == capnp::DynamicValue::LIST) {
    auto list = value.as<capnp::DynamicList>();
    const auto element = list.getSchema().getElementType();
    if (element.isStruct() || element.isList() || element.isText() || element.isData()) {
      for (auto item : list)
        readAllFields(item);
    }
  }
}

}  // namespace

std::shared_ptr<std::byte> allocateAligned(std::size_t bytes) {
  const std::size_t rounded = std::max<std::size_t>(64, (bytes + 63) / 64 * 64);
  void* p = std::aligned_alloc(64, rounded);
  if (!p) throw std::bad_alloc();
  return std::shared_ptr<std::byte>(static_cast<std::byte*>(p), [](std::byte* q) { std::free(q); });
}

BufferPool::~BufferPool() {
  for (auto& [bytes, buffer] : idle_)
    std::free(buffer);
}

std::shared_ptr<std::byte> BufferPool::allocate(std::size_t bytes) {
  std::size_t rounded = std::max<std::size_t>(64, (bytes + 63) / 64 * 64);
  if (rounded < kMinPooledBytes) return allocateAligned(bytes);
  std::byte* buffer = nullptr;
  {
    std::lock_guard lock(mutex_);
    auto it = idle_.lower_bound(rounded);
    if (it != idle_.end() && it->first / 2 <= rounded) {
      rounded = it->first;
      buffer = it->second;
      idleBytes_ -= rounded;
      idle_.erase(it);
    }
  }
  if (!buffer) {
    buffer = static_cast<std::byte*>(std::aligned_alloc(64, rounded));
    if (!buffer) throw std::bad_alloc();
  }
  return std::shared_ptr<std::byte>(buffer, [pool = weak_from_this(), rounded](std::byte* b) {
    if (auto alive = pool.lock()) {
      alive->release(b, rounded);
    } else {
      std::free(b);
    }
  });
}

void BufferPool::release(std::byte* buffer, std::size_t bytes) {
  {
    std::lock_guard lock(mutex_);
    if (idleBytes_ + bytes <= capacity_) {
      idle_.emplace(bytes, buffer);
      idleBytes_ += bytes;
      return;
    }
  }
  std::free(buffer);
}

OutgoingMessage::OutgoingMessage() : state_(std::make_unique<State>()) {}
OutgoingMessage::~OutgoingMessage() = default;
OutgoingMessage::OutgoingMessage(OutgoingMessage&&) noexcept = default;
OutgoingMessage& OutgoingMessage::operator=(OutgoingMessage&&) noexcept = default;

wire::Frame::Builder OutgoingMessage::frame() {
  return state_->builder.getRoot<wire::Frame>();
}

capnp::MessageBuilder& OutgoingMessage::builder() {
  return state_->builder;
}

std::unique_ptr<OutgoingMessage::State> OutgoingMessage::takeState() {
  return std::move(state_);
}

void OutgoingMessage::setLane(int lane) {
  lane_ = lane;
}

void OutgoingMessage::setTensor(wire::TensorData::Builder slot, kernels::Tensor tensor) {
  if (tensor.bytes() == 0) return;
  if (tensor.device().kind != kernels::DeviceKind::kCpu) {
    throw InputError("transport: only host tensors can be sent; got a tensor of shape " +
                     kernels::toString(tensor.shape()) + " on a CUDA device");
  }
  state_->pending.push_back({slot, std::move(tensor)});
}

namespace {

// The tensors a message has yet to place (OutgoingMessage::State::pending).
using PendingList = std::vector<OutgoingMessage::State::Pending>;

// Tensors in the arena the receiver maps go as (offset, bytes) in Frame.shared, and leave the
// pending list for the message's tensors.
void shareArenaTensors(OutgoingMessage::State& state, SharedArena& arena) {
  auto& pending = state.pending;
  std::vector<std::pair<std::uint64_t, std::uint64_t>> shared;
  std::size_t kept = 0;
  for (std::size_t i = 0; i < pending.size(); ++i) {
    auto& p = pending[i];
    if (auto offset = arena.share(p.tensor.raw(), p.tensor.bytes())) {
      p.slot.setSharedPart(static_cast<std::int32_t>(shared.size()));
      shared.emplace_back(*offset, p.tensor.bytes());
      state.tensors.push_back(std::move(p.tensor));
    } else if (kept++ != i) {
      pending[kept - 1] = std::move(p);
    }
  }
  pending.erase(pending.begin() + static_cast<std::ptrdiff_t>(kept), pending.end());
  if (!shared.empty()) {
    auto parts =
        state.builder.getRoot<wire::Frame>().initShared(static_cast<unsigned>(shared.size()));
    for (unsigned k = 0; k < shared.size(); ++k) {
      parts[k].setOffset(shared[k].first);
      parts[k].setBytes(shared[k].second);
    }
  }
}

// Inline or bulk, per pending tensor: large tensors go bulk, then the largest inline ones until
// the frame fits. InputError if the message without its tensors exceeds the frame limit.
std::vector<bool> chooseBulk(const PendingList& pending, capnp::MessageBuilder& builder,
                             const EncodeLimits& limits) {
  std::size_t baseBytes = kFrameHeaderBytes + 64 + 16 * pending.size();
  for (auto segment : builder.getSegmentsForOutput())
    baseBytes += segment.size() * 8 + 4;
  if (baseBytes > limits.maxFrameBytes) {
    throw InputError("transport: a message of " + std::to_string(baseBytes) +
                     " bytes without its tensors exceeds the frame limit of " +
                     std::to_string(limits.maxFrameBytes) + " bytes");
  }
  std::vector<bool> bulk(pending.size(), false);
  std::vector<std::size_t> bySize(pending.size());
  std::iota(bySize.begin(), bySize.end(), 0);
  std::stable_sort(bySize.begin(), bySize.end(), [&](std::size_t a, std::size_t b) {
    return pending[a].tensor.bytes() > pending[b].tensor.bytes();
  });
  std::size_t inlineBytes = 0;
  for (std::size_t i : bySize) {
    const std::size_t bytes = pending[i].tensor.bytes() + 8;
    if (bytes > limits.inlineTensorBytes ||
        baseBytes + inlineBytes + bytes > limits.maxFrameBytes) {
      bulk[i] = true;
    } else {
      inlineBytes += bytes;
    }
  }
  return bulk;
}

// An inline tensor: a segment of the message that is written from the tensor's memory.
struct External {
  const capnp::word* segment;
  std::size_t words;
  const std::byte* data;
  std::size_t bytes;
  std::size_t lead;
};

// Points each pending tensor's slot at its bytes: an inline one at external data in the message
// (its segment and tensor in *externals), a bulk one at its part (its pending index in
// *bulkParts, whose sizes go in Frame.bulk).
void placeTensors(PendingList& pending, const std::vector<bool>& bulk,
                  capnp::MessageBuilder& builder, std::vector<External>* externals,
                  std::vector<std::size_t>* bulkParts) {
  auto orphanage = builder.getOrphanage();
  for (std::size_t i = 0; i < pending.size(); ++i) {
    auto& [slot, tensor] = pending[i];
    const auto* data = static_cast<const std::byte*>(tensor.raw());
    if (bulk[i]) {
      slot.setBulkPart(static_cast<std::int32_t>(bulkParts->size()));
      bulkParts->push_back(i);
      continue;
    }
    // The blob starts at the aligned address at or before the data; the lead goes out as zeros.
    const std::size_t lead = reinterpret_cast<std::uintptr_t>(data) % 8;
    const std::byte* aligned = data - lead;
    const std::size_t blobBytes = lead + tensor.bytes();
    slot.adoptData(orphanage.referenceExternalData(
        capnp::Data::Reader(reinterpret_cast<const kj::byte*>(aligned), blobBytes)));
    slot.setLead(static_cast<std::uint8_t>(lead));
    externals->push_back({reinterpret_cast<const capnp::word*>(aligned), wordsFor(blobBytes), data,
                          tensor.bytes(), lead});
  }
  if (!bulkParts->empty()) {
    auto sizes = builder.getRoot<wire::Frame>().initBulk(static_cast<unsigned>(bulkParts->size()));
    for (unsigned k = 0; k < bulkParts->size(); ++k)
      sizes.set(k, pending[(*bulkParts)[k]].tensor.bytes());
  }
}

// The message frame: header, segment table, segments (external ones written from the tensor).
void writeMessageFrame(capnp::MessageBuilder& builder, const std::vector<External>& externals,
                       const EncodeLimits& limits, EncodedMessage& out) {
  auto segments = builder.getSegmentsForOutput();
  TROUPE_ENFORCE(segments.size() >= 1 && segments.size() <= kMaxSegments, "a message with ",
                 segments.size(), " segments");
  std::size_t payloadBytes = 0;
  out.table.assign(segmentTableBytes(static_cast<std::uint32_t>(segments.size())), std::byte{0});
  for (std::size_t s = 0; s < segments.size(); ++s) {
    const auto words = static_cast<std::uint32_t>(segments[s].size());
    std::memcpy(out.table.data() + 4 * s, &words, 4);
    payloadBytes += segments[s].size() * 8;
  }
  out.headers.push_back(encodeFrameHeader(
      {FrameKind::kMessage, static_cast<std::uint32_t>(segments.size()), payloadBytes, 0}));
  out.pieces.push_back(out.headers.back());
  out.pieces.push_back(out.table);
  for (auto segment : segments) {
    auto external = std::find_if(externals.begin(), externals.end(), [&](const External& e) {
      return e.segment == segment.begin() && e.words == segment.size();
    });
    if (external == externals.end()) {
      out.pieces.push_back(std::as_bytes(std::span(segment.begin(), segment.size())));
      continue;
    }
    if (external->lead) out.pieces.push_back(std::span(kZeros, external->lead));
    out.pieces.push_back(std::span(external->data, external->bytes));
    const std::size_t pad = external->words * 8 - external->lead - external->bytes;
    if (pad) out.pieces.push_back(std::span(kZeros, pad));
  }
  out.bytes = kFrameHeaderBytes + out.table.size() + payloadBytes;
  TROUPE_ENFORCE_LE(out.bytes, limits.maxFrameBytes);
}

// The bulk parts, in chunks of at most the chunk limit, each a frame of its own.
void writeBulkFrames(const PendingList& pending, const std::vector<std::size_t>& bulkParts,
                     const EncodeLimits& limits, EncodedMessage& out) {
  const std::size_t chunk = std::max<std::size_t>(
      8, std::min(limits.bulkChunkBytes, limits.maxFrameBytes - kFrameHeaderBytes));
  for (std::size_t k = 0; k < bulkParts.size(); ++k) {
    const auto& tensor = pending[bulkParts[k]].tensor;
    const auto* data = static_cast<const std::byte*>(tensor.raw());
    for (std::size_t offset = 0; offset < tensor.bytes(); offset += chunk) {
      const std::size_t bytes = std::min(chunk, tensor.bytes() - offset);
      out.headers.push_back(
          encodeFrameHeader({FrameKind::kBulk, static_cast<std::uint32_t>(k), bytes, offset}));
      out.pieces.push_back(out.headers.back());
      out.pieces.push_back(std::span(data + offset, bytes));
      out.bytes += kFrameHeaderBytes + bytes;
    }
  }
}

}  // namespace

EncodedMessage encodeMessage(std::shared_ptr<OutgoingMessage::State> state,
                             const EncodeLimits& limits, SharedArena* arena) {
  EncodedMessage out;
  auto& pending = state->pending;
  auto& builder = state->builder;
  if (arena) shareArenaTensors(*state, *arena);
  const std::vector<bool> bulk = chooseBulk(pending, builder, limits);
  std::vector<External> externals;
  std::vector<std::size_t> bulkParts;
  placeTensors(pending, bulk, builder, &externals, &bulkParts);
  writeMessageFrame(builder, externals, limits, out);
  writeBulkFrames(pending, bulkParts, limits, out);
  for (auto& p : pending)
    state->tensors.push_back(std::move(p.tensor));
  pending.clear();
  out.state = std::move(state);
  return out;
}

std::shared_ptr<IncomingMessage::State> startMessage(const FrameHeader& header,
                                                     const std::byte* table, BufferPool& pool) {
  std::uint64_t words = 0;
  std::vector<std::uint32_t> sizes(header.count);
  for (std::uint32_t s = 0; s < header.count; ++s) {
    std::memcpy(&sizes[s], table + 4 * s, 4);
    words += sizes[s];
  }
  if (words * 8 != header.bytes || sizes[0] == 0) {
    throw InputError(
        fmt::format("malformed segment table: segments of {} words in a frame of {} "
                    "bytes{}",
                    words, header.bytes, sizes[0] == 0 ? " (empty root segment)" : ""));
  }
  auto state = std::make_shared<IncomingMessage::State>();
  state->buffer = pool.allocate(header.bytes);
  state->bufferBytes = header.bytes;
  const auto* at = reinterpret_cast<const capnp::word*>(state->buffer.get());
  for (auto size : sizes) {
    state->segments.push_back(kj::arrayPtr(at, size));
    at += size;
  }
  return state;
}

void parseMessage(IncomingMessage::State& message, const TransportOptions& options) {
  capnp::ReaderOptions limits;
  limits.traversalLimitInWords = options.traversalLimitWords;
  limits.nestingLimit = options.nestingLimit;
  auto segments = kj::arrayPtr(message.segments.data(), message.segments.size());
  std::string problem;
  try {
    // Walk the whole message with readers of its own, so the caller's reader starts with its full
    // traversal budget: once for the limits, once reading every field of a Frame.
    capnp::SegmentArrayMessageReader check(segments, limits);
    check.getRoot<wire::Frame>().totalSize();
    capnp::SegmentArrayMessageReader typed(segments, limits);
    readAllFields(typed.getRoot<capnp::DynamicStruct>(capnp::Schema::from<wire::Frame>()));
    message.reader = std::make_unique<capnp::SegmentArrayMessageReader>(segments, limits);
  } catch (const kj::Exception& e) {
    problem = e.getDescription().cStr();
  } catch (const std::exception& e) {
    problem = e.what();
  }
  if (!problem.empty()) {
    throw InputError("malformed message (rejected by the reader limits or not a Frame): " +
                     problem);
  }
}

void planBulkParts(IncomingMessage::State& message, const TransportOptions& options) {
  std::uint64_t total = 0;
  for (auto size : message.reader->getRoot<wire::Frame>().getBulk()) {
    if (size > options.maxBulkBytes || total + (size + 63) / 64 * 64 > options.maxBulkBytes) {
      throw InputError(fmt::format("a message announces over {} bulk bytes", options.maxBulkBytes));
    }
    message.partOffsets.push_back(total);
    message.partSizes.push_back(size);
    total += (size + 63) / 64 * 64;
  }
  message.bulkBytes = total;
}

std::byte* bulkChunkTarget(const PendingBulk& pending, const FrameHeader& chunk) {
  if (!pending.message) throw InputError("a bulk chunk arrived without a message announcing it");
  const std::size_t partSize = pending.message->partSizes[pending.part];
  if (chunk.count != pending.part || chunk.offset != pending.offset ||
      chunk.bytes > partSize - pending.offset) {
    throw InputError(fmt::format(
        "bulk chunk for part {} at {} of {} bytes, expected part {} at {} (part of {} bytes)",
        chunk.count, chunk.offset, chunk.bytes, pending.part, pending.offset, partSize));
  }
  return pending.message->bulk.get() + pending.message->partOffsets[pending.part] + pending.offset;
}

std::shared_ptr<IncomingMessage::State> advanceBulk(PendingBulk& pending, std::size_t bytes) {
  pending.offset += bytes;
  while (pending.offset == pending.message->partSizes[pending.part]) {
    pending.offset = 0;
    if (++pending.part == pending.message->partSizes.size()) {
      pending.part = 0;
      return std::exchange(pending.message, nullptr);
    }
  }
  return nullptr;
}

IncomingMessage::IncomingMessage(std::shared_ptr<const State> state) : state_(std::move(state)) {}

wire::Frame::Reader IncomingMessage::frame() const {
  return state_->reader->getRoot<wire::Frame>();
}

kernels::Tensor IncomingMessage::tensor(wire::TensorData::Reader data, kernels::Shape shape,
                                        kernels::DType dtype) const {
  const std::byte* begin = nullptr;
  std::size_t bytes = 0;
  if (data.getSharedPart() >= 0) {
    const auto part = static_cast<std::size_t>(data.getSharedPart());
    if (part >= state_->shared.size()) {
      throw InputError("transport: a tensor names shared part " + std::to_string(part) +
                       " of a message with " + std::to_string(state_->shared.size()));
    }
    begin = state_->shared[part].get();
    bytes = state_->sharedSizes[part];
  } else if (data.getBulkPart() >= 0) {
    const auto part = static_cast<std::size_t>(data.getBulkPart());
    if (part >= state_->partSizes.size()) {
      throw InputError("transport: a tensor names bulk part " + std::to_string(part) +
                       " of a message with " + std::to_string(state_->partSizes.size()));
    }
    begin = state_->bulk.get() + state_->partOffsets[part];
    bytes = state_->partSizes[part];
  } else {
    auto blob = data.getData();
    if (data.getLead() > blob.size()) {
      throw InputError("transport: a tensor's lead of " + std::to_string(data.getLead()) +
                       " bytes exceeds its blob of " + std::to_string(blob.size()));
    }
    begin = reinterpret_cast<const std::byte*>(blob.begin()) + data.getLead();
    bytes = blob.size() - data.getLead();
  }
  const std::size_t element = kernels::sizeOf(dtype);
  if (bytes % element != 0) {
    throw InputError("transport: a tensor of " + std::to_string(bytes) +
                     " bytes is not a whole number of elements");
  }
  const auto numel = static_cast<std::int64_t>(bytes / element);
  if (shape.empty()) {
    if (numel == 0) return kernels::Tensor();
    shape = {numel};
  }
  if (kernels::numelOf(shape) != numel) {
    throw InputError("transport: a tensor of " + std::to_string(numel) +
                     " elements does not fit shape " + kernels::toString(shape));
  }
  auto* p = const_cast<std::byte*>(begin);
  return kernels::Tensor(std::shared_ptr<void>(state_, p), p, std::move(shape), dtype,
                         kernels::Device{});
}

std::span<const std::byte> IncomingMessage::frameBuffer() const {
  return {state_->buffer.get(), state_->bufferBytes};
}

std::span<const std::byte> IncomingMessage::bulkBuffer() const {
  return {state_->bulk.get(), state_->bulkBytes};
}

IncomingMessage loopback(OutgoingMessage message, const TransportOptions& options) {
  const EncodeLimits limits{options.maxFrameBytes, options.inlineTensorBytes,
                            options.bulkChunkBytes};
  const auto encoded =
      encodeMessage(std::shared_ptr<OutgoingMessage::State>(message.takeState()), limits);
  std::vector<std::byte> bytes;
  for (const auto piece : encoded.pieces)
    bytes.insert(bytes.end(), piece.begin(), piece.end());
  const std::byte* at = bytes.data();
  const auto header = decodeFrameHeader(at, options.maxFrameBytes);
  at += kFrameHeaderBytes;
  static const auto pool = std::make_shared<BufferPool>(0);
  auto state = startMessage(header, at, *pool);
  at += segmentTableBytes(header.count);
  std::memcpy(state->buffer.get(), at, header.bytes);
  parseMessage(*state, options);
  TROUPE_ENFORCE(state->reader->getRoot<wire::Frame>().getBulk().size() == 0,
                 "loopback of a message with bulk parts");
  return IncomingMessage(state);
}

}  // namespace troupe::transport
