// What a Transport is built from.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

namespace spdlog {
class logger;
}

namespace troupe::transport {

using NodeId = std::uint32_t;

struct TransportOptions {
  NodeId node = 0;
  std::string runId;  // a peer with another run id is refused
  // This run's incarnation, agreed at rendezvous (a random nonce rank 0 makes): a peer with the
  // same run id and secret but another incarnation (a second run started with the same id, or
  // another generation) is refused, and the error names both. Empty: not checked.
  std::string incarnation;
  // The run's secret: a peer that cannot prove it knows it is refused before anything it sends
  // is read (see auth.h). Empty: links check the run id only.
  std::string secret;

  // Where to listen. `interface` (e.g. "eth0"; empty: $TROUPE_INTERFACE) wins over `host`;
  // `host` empty: the first non-loopback IPv4 address (loopback if there is none); the transport
  // listens on that address only, never on every interface.
  std::string interface;
  std::string host;
  std::uint16_t port = 0;  // 0: any free port
  // Also listen on an abstract Unix-domain socket (Linux), "@troupe-RUN-nodeN-RANDOM": no file or
  // folder that another user could plant, rename or leave stale; it goes with the process. Only
  // processes of this user (SO_PEERCRED) are let in; peers on this host link through it.
  bool unixSocket = false;

  // Frame limit: a frame announcing more drops the link. Larger tensors travel as bulk chunks.
  std::size_t maxFrameBytes = std::size_t{64} << 20;
  // Tensors above this (and any that would overflow a frame) go as bulk parts.
  std::size_t inlineTensorBytes = std::size_t{16} << 20;
  // Bulk chunk size (capped so that a chunk fits the frame limit).
  std::size_t bulkChunkBytes = std::size_t{16} << 20;
  // Most bulk bytes one message may announce (the receiver allocates that much).
  std::uint64_t maxBulkBytes = std::uint64_t{8} << 30;
  // Shared-memory arena for tensors to peers on this host, over Unix-socket links (bytes; 0:
  // none, every byte goes through the socket). See shared_arena.h.
  std::size_t sharedArenaBytes = std::size_t{256} << 20;
  // Freed receive buffers kept for reuse (bytes; 0: none).
  std::size_t receivePoolBytes = std::size_t{256} << 20;
  // Cap'n Proto reader limits for received frames.
  std::uint64_t traversalLimitWords = (std::uint64_t{64} << 20) / 8;
  int nestingLimit = 64;

  // TCP connections a dialing node opens to each peer (Unix-socket links always have one). The
  // first carries every ordered message; messages sent with a lane (OutgoingMessage::setLane,
  // for which order does not matter, e.g. ring chunks) spread over all of them, so that a
  // transfer is not held to one connection's window and one core's TCP processing.
  int connectionsPerPeer = 1;
  int ioThreads = 1;
  std::chrono::milliseconds connectTimeout{30000};
  // An accepted connection that has not authenticated within this is closed; at most
  // maxPendingHandshakes such connections per listener, more wait in the kernel's backlog.
  std::chrono::milliseconds handshakeTimeout{5000};
  int maxPendingHandshakes = 64;
  // Every link sends a heartbeat when it has sent nothing for heartbeatInterval, and is dropped
  // (onPeerLost, an error naming the node) when nothing at all arrived on it for peerTimeout: a
  // hung process or a cut link ends the run instead of hanging it. 0: no timeout.
  std::chrono::milliseconds heartbeatInterval{1000};
  std::chrono::milliseconds peerTimeout{60000};
  std::shared_ptr<spdlog::logger> logger;  // null: spdlog's default logger
};

}  // namespace troupe::transport
