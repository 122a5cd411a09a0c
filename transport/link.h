// A process's links to the other processes (nodes) of a run.
//
// A Transport listens on TCP (an interface's IPv4 address, any port by default) and, if asked, on
// an abstract Unix-domain socket with a random name; address() advertises both,
// "tcp://ip:port;unix://@name". connect() picks the Unix socket when the peer's TCP address is one
// of this host's, else TCP. Each link starts with the authentication handshake (auth.h; an accepted
// connection has options.handshakeTimeout for it, and a listener holds at most
// options.maxPendingHandshakes unauthenticated connections), then a Hello both ways (node id, run
// id, incarnation). A Hello of another run, another incarnation, or of a node that is linked
// already is refused: the refusing side logs why and sends it in a refusal frame, so that the
// other side's error says it too. A link may be used in both directions, and the first link to a
// node carries every send to it, so messages to one node arrive in send order.
// Between processes of one host, tensors allocated with sendBuffer travel through shared memory.
// Failures never abort: a peer that sends garbage, an oversized or malformed frame, or a message
// over the reader limits, or that closes mid-frame, loses its link (one error logged, naming the
// node and the remote address) and onPeerLost fires; other links go on.
// Threads: the transport runs its own I/O threads; handlers run on them, in order per link, and
// should return quickly (a slow handler stalls every link on that thread).
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "transport/message.h"
#include "transport/options.h"
#include "troupe/error.h"

namespace troupe::transport {

// Thrown by Transport::send to a node whose link was lost (the peer closed it, an I/O error, a
// heartbeat timeout), as opposed to a node never linked: the peer is gone. The message says why.
class LinkLostError : public IoError {
 public:
  using IoError::IoError;
};

struct TransportHandlers {
  // A message from `node` (never a Hello). Throwing from it drops that node's link.
  std::function<void(NodeId node, IncomingMessage message)> onMessage;
  // The link to `node` is gone (peer closed, I/O error, protocol error); not called on our close.
  std::function<void(NodeId node, const std::string& why)> onPeerLost;
};

class Transport {
 public:
  virtual ~Transport() = default;  // closes every link; no handler runs after it returns

  // Any thread.
  virtual NodeId node() const = 0;
  virtual std::string address() const = 0;
  // The remote address of the link to `node` ("unix:///..." or "tcp://..."), "" if none.
  virtual std::string linkAddress(NodeId node) const = 0;

  // Opens a link to `node` at `address` (as its address() gives it) and waits for its Hello;
  // retries refused connections until options.connectTimeout. No-op if a link exists. Any thread
  // but the transport's. Throws TimeoutError, IoError, or InputError (bad address, wrong node).
  virtual void connect(NodeId node, const std::string& address) = 0;
  // TCP connections to `node`: 0 without a link, else 1 plus the extra ones
  // (TransportOptions::connectionsPerPeer). Any thread.
  virtual int connections(NodeId node) const = 0;
  // Waits until a link to `node` exists (ours or the peer's). Throws TimeoutError.
  virtual void waitForPeer(NodeId node, std::chrono::milliseconds timeout) = 0;

  // Queues `message` for `node` and returns; tensors larger than the inline limit, or too large
  // together for one frame, go as bulk chunks (see frame.h). Any thread; ordered per node.
  // Throws LinkLostError if the link to `node` was lost, IoError if there never was one,
  // InputError if the non-tensor part of the message alone exceeds the frame limit.
  virtual void send(NodeId node, OutgoingMessage message) = 0;

  // Memory for a tensor that will be sent to `node`: in this process's shared arena when the
  // link to `node` is a same-host link whose peer mapped it (the receiver then reads the tensor
  // where it is written, and its bytes never cross the socket), else ordinary host memory. The
  // tensor must not be written once it was sent. Any thread.
  virtual kernels::Tensor sendBuffer(NodeId node, kernels::Shape shape,
                                     kernels::DType dtype = kernels::DType::kFloat32) = 0;
  // sendBuffer's shared memory only: an undefined tensor (raw() null) when the link to `node`
  // has none (another host, no link yet, a full arena). A sender that has none writes from its
  // own memory instead (no copy), keeping it unchanged until the transport releases it. Any
  // thread.
  virtual kernels::Tensor sharedBuffer(NodeId node, kernels::Shape shape,
                                       kernels::DType dtype = kernels::DType::kFloat32) = 0;
};

// Starts listening at once. Throws InputError (bad options, unknown interface) or IoError.
std::unique_ptr<Transport> makeTransport(const TransportOptions& options,
                                         TransportHandlers handlers);

// The IPv4 address of network interface `name` ("lo" -> "127.0.0.1"). Throws InputError naming
// the interfaces that exist if there is none such (or it has no IPv4 address).
std::string resolveInterface(const std::string& name);

}  // namespace troupe::transport
