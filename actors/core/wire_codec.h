// Actor messages <-> transport frames: what lets `send` reach an actor in another process without
// the actor knowing. Tensors are not copied either way: outgoing frames point at the tensors'
// memory, incoming messages hold views into the receive buffer.
#pragma once

#include <cstdint>
#include <memory>

#include "troupe/actor.h"

namespace troupe::transport {
class OutgoingMessage;
class IncomingMessage;
}  // namespace troupe::transport

namespace troupe::actors {

// Throws InvariantError for a message type that has no wire form (it never crosses processes).
transport::OutgoingMessage encodeMessage(Address from, Address to, Envelope& message);

struct Decoded {
  Address from;
  std::uint32_t target = 0;  // actor id on this node
  std::unique_ptr<Envelope> message;
};
// Throws InputError for a frame that carries no actor message or malformed tensors.
Decoded decodeMessage(std::uint32_t from_node, const transport::IncomingMessage& message);

}  // namespace troupe::actors
