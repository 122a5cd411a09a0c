// Messages as the transport moves them: a Cap'n Proto wire::Frame plus the tensors it points at.
//
// Sending: build the frame, point its TensorData fields at tensors with setTensor (no copy: each
// tensor becomes its own segment, or a bulk part when it is large) and hand the message to
// Transport::send, which keeps the tensors alive until they are written.
// Receiving: the frame is parsed in place in one buffer; tensor() returns views INTO that buffer
// (or into the bulk buffer), whose storage the views share. Neither copies tensor bytes.
// Thread safety: an OutgoingMessage belongs to one thread until sent. An IncomingMessage is a
// cheap shared handle; copies may be read from several threads (Cap'n Proto's read limiter is
// shared and only approximate then).
#pragma once

#include <cstddef>
#include <memory>
#include <span>

#include "kernels/tensor.h"
#include "transport/wire.capnp.h"

namespace troupe::transport {

class OutgoingMessage {
 public:
  OutgoingMessage();
  ~OutgoingMessage();
  OutgoingMessage(OutgoingMessage&&) noexcept;
  OutgoingMessage& operator=(OutgoingMessage&&) noexcept;

  // The root. The transport sets sourceNode and bulk; the caller sets the rest.
  wire::Frame::Builder frame();
  // The whole message, for callers that need another root (tests of malformed input).
  capnp::MessageBuilder& builder();

  // Makes `slot` carry `tensor`'s bytes (host memory, any dtype, any alignment) without copying
  // them. The tensor stays alive, and must not be written, until the message is sent. An
  // undefined or empty tensor gives an empty slot.
  void setTensor(wire::TensorData::Builder slot, kernels::Tensor tensor);

  // Order between this message and others to the same node does not matter: the transport may
  // send it on connection `lane % connections` to that node (TransportOptions::
  // connectionsPerPeer). Default (-1): the first connection, in send order.
  void setLane(int lane);

  // The transport's.
  struct State;
  int lane() const { return lane_; }
  std::unique_ptr<State> takeState();

 private:
  std::unique_ptr<State> state_;
  int lane_ = -1;
};

class IncomingMessage {
 public:
  struct State;
  explicit IncomingMessage(std::shared_ptr<const State> state);

  wire::Frame::Reader frame() const;

  // A view of a tensor field, sharing the receive buffer (no copy). `shape` empty: flat (an empty
  // field gives an undefined Tensor). Throws InputError if the field's size does not fit the
  // shape or dtype, or it names a bulk part the message lacks.
  kernels::Tensor tensor(wire::TensorData::Reader data, kernels::Shape shape = {},
                         kernels::DType dtype = kernels::DType::kFloat32) const;

  // The memory the frame was parsed from, and the bulk parts' memory (empty if none).
  std::span<const std::byte> frameBuffer() const;
  std::span<const std::byte> bulkBuffer() const;

 private:
  std::shared_ptr<const State> state_;
};

}  // namespace troupe::transport
