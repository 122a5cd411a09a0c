// The Asio Transport: one io_context, a TCP and a Unix acceptor, one Connection per socket.
// A Connection's reads, writes and closing run on its strand; send() only queues and posts.
#include <arpa/inet.h>
#include <capnp/message.h>
#include <capnp/serialize.h>
#include <fmt/format.h>
#include <netinet/in.h>
#include <spdlog/spdlog.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <asio.hpp>
#include <atomic>
#include <condition_variable>
#include <cstdlib>
#include <deque>
#include <future>
#include <map>
#include <mutex>
#include <optional>
#include <random>
#include <set>
#include <thread>
#include <utility>

#include "transport/accept_gate.h"
#include "transport/auth.h"
#include "transport/interfaces.h"
#include "transport/link.h"
#include "transport/message_state.h"
#include "transport/refusal_report.h"
#include "transport/shared_arena.h"
#include "troupe/error.h"

namespace troupe::transport {
namespace {

using Socket = asio::generic::stream_protocol::socket;
using Endpoint = asio::generic::stream_protocol::endpoint;
using Strand = asio::strand<asio::io_context::executor_type>;
using Clock = std::chrono::steady_clock;

std::string describe(const Endpoint& endpoint, const std::string& fallback) {
  const sockaddr* address = endpoint.data();
  char text[INET6_ADDRSTRLEN] = {};
  if (address->sa_family == AF_INET) {
    const auto* in = reinterpret_cast<const sockaddr_in*>(address);
    inet_ntop(AF_INET, &in->sin_addr, text, sizeof text);
    return fmt::format("tcp://{}:{}", text, ntohs(in->sin_port));
  }
  if (address->sa_family == AF_INET6) {
    const auto* in = reinterpret_cast<const sockaddr_in6*>(address);
    inet_ntop(AF_INET6, &in->sin6_addr, text, sizeof text);
    return fmt::format("tcp://[{}]:{}", text, ntohs(in->sin6_port));
  }
  if (address->sa_family == AF_UNIX && endpoint.size() > offsetof(sockaddr_un, sun_path)) {
    const auto* un = reinterpret_cast<const sockaddr_un*>(address);
    if (un->sun_path[0] != '\0') return std::string("unix://") + un->sun_path;
    const std::size_t length = endpoint.size() - offsetof(sockaddr_un, sun_path);
    if (length > 1) return "unix://@" + std::string(un->sun_path + 1, length - 1);
  }
  return fallback;
}

struct ParsedAddress {
  std::string tcpHost;
  std::string tcpPort;
  std::string unixPath;
};

ParsedAddress parseAddress(const std::string& address) {
  ParsedAddress out;
  std::size_t begin = 0;
  while (begin <= address.size()) {
    std::size_t end = address.find(';', begin);
    if (end == std::string::npos) end = address.size();
    const std::string part = address.substr(begin, end - begin);
    begin = end + 1;
    if (part.empty()) continue;
    if (part.rfind("tcp://", 0) == 0) {
      const std::string hostPort = part.substr(6);
      const auto colon = hostPort.rfind(':');
      if (colon == std::string::npos || colon == 0 || colon + 1 == hostPort.size()) {
        throw InputError("transport: bad TCP address '" + part + "' (want tcp://host:port)");
      }
      out.tcpHost = hostPort.substr(0, colon);
      if (out.tcpHost.front() == '[' && out.tcpHost.back() == ']') {
        out.tcpHost = out.tcpHost.substr(1, out.tcpHost.size() - 2);
      }
      out.tcpPort = hostPort.substr(colon + 1);
    } else if (part.rfind("unix://", 0) == 0) {
      out.unixPath = part.substr(7);
    } else {
      throw InputError("transport: bad address '" + part +
                       "' (want tcp://host:port, unix:///path or unix://@abstract, joined by ';')");
    }
  }
  if (out.tcpHost.empty() && out.unixPath.empty()) {
    throw InputError("transport: empty address '" + address + "'");
  }
  return out;
}

bool isLocalHost(const std::string& host) {
  if (host.rfind("127.", 0) == 0 || host == "localhost" || host == "::1") return true;
  for (const auto& i : listInterfaces()) {
    if (i.ipv4 == host) return true;
  }
  return false;
}

// "unix://@name" is an abstract socket (Linux): its sun_path starts with a zero byte.
asio::local::stream_protocol::endpoint unixEndpoint(const std::string& path) {
  if (!path.empty() && path.front() == '@') {
    return asio::local::stream_protocol::endpoint(std::string(1, '\0') + path.substr(1));
  }
  return asio::local::stream_protocol::endpoint(path);
}

// Which listener accepted a connection (its AcceptGate counts it until it authenticates).
enum class Listener { kNone = -1, kTcp = 0, kUnix = 1 };

class AsioTransport;

class Connection : public std::enable_shared_from_this<Connection> {
 public:
  Connection(AsioTransport& owner, Socket socket, std::string remote,
             std::optional<NodeId> expected, Listener listener = Listener::kNone, int lane = 0);

  // Any thread.
  void start(std::shared_ptr<std::promise<void>> helloWaiter);
  void enqueue(std::unique_ptr<EncodedMessage> message);
  void close(const std::string& why, bool error);

  const std::string& remote() const { return remote_; }
  bool identified() const { return identified_.load(); }
  NodeId node() const { return node_.load(); }
  std::string peerName() const { return identified() ? std::to_string(node()) : "?"; }
  // The peer mapped this process's shared arena: tensors in it may go as shared parts.
  bool peerMappedArena() const { return peerMappedArena_.load(); }
  // 0: the link to the node; k > 0: its k-th extra connection (TransportOptions::
  // connectionsPerPeer).
  int lane() const { return lane_.load(); }

 private:
  void handshake();
  // A handshake's turn: writes `mine`, then reads the peer's `theirs` and goes on at `next`.
  void exchange(asio::const_buffer mine, asio::mutable_buffer theirs,
                void (Connection::*next)(const asio::error_code&));
  void onChallenge(const asio::error_code& error);
  void onProof(const asio::error_code& error);
  void heartbeat();
  void readHeader();
  void onHeader(const asio::error_code& error, std::size_t got);
  void onTable(const asio::error_code& error);
  void onPayload(const asio::error_code& error, std::shared_ptr<IncomingMessage::State> state);
  void onBulk(const asio::error_code& error);
  void onHello(wire::Hello::Reader hello);
  // Tells the peer why this link is refused (a refusal frame), then closes it. `kind`: how its
  // listener's report counts it (refusal_report.h), if it was accepted.
  void refuse(std::string_view kind, const std::string& why);
  // Once: the accepting listener may take another unauthenticated connection.
  void releaseListener();
  void mapPeerArena(wire::Hello::Reader hello);
  bool takeSharedParts(wire::Frame::Reader frame, IncomingMessage::State& state);
  void deliver(std::shared_ptr<IncomingMessage::State> state);
  void failRead(const asio::error_code& error, const std::string& during);
  // Closes the socket and tells the transport. An accepted connection that never became a link
  // counts as refused, under `kind` (empty: closed during the handshake, or before its Hello).
  void closeOnStrand(const std::string& why, bool error, std::string_view kind = {});
  void startWrite();
  // Writes what the socket takes without blocking (mutex_ held); returns the bytes written.
  std::size_t writeNow(const EncodedMessage& message);
  void onWritten(const asio::error_code& error);

  AsioTransport& owner_;
  Socket socket_;
  Strand strand_;
  const std::string remote_;
  const std::optional<NodeId> expected_;
  std::atomic<bool> closed_{false};
  std::string closedWhy_;  // why it closed (under mutex_), for enqueue()'s error
  std::atomic<bool> identified_{false};
  std::atomic<NodeId> node_{0};
  const bool unix_;  // a Unix-socket link: the peer is on this host
  const Listener listener_;
  bool listenerReleased_ = false;  // strand only
  std::atomic<bool> peerMappedArena_{false};
  std::atomic<int> lane_;

  // Strand only.
  Handshake handshake_;
  std::array<std::byte, kChallengeBytes> peerChallenge_{};
  std::array<std::byte, kProofBytes> proof_{}, peerProof_{};
  asio::steady_timer authTimer_;
  asio::steady_timer heartbeatTimer_;
  Clock::time_point lastRead_ = Clock::now();
  std::shared_ptr<PeerArena> peerArena_;  // the peer's shared arena, mapped here
  std::shared_ptr<std::promise<void>> helloWaiter_;
  std::array<std::byte, kFrameHeaderBytes> header_{};
  FrameHeader frame_;
  std::vector<std::byte> table_;
  PendingBulk bulk_;
  std::vector<std::unique_ptr<EncodedMessage>> inflight_;
  std::vector<asio::const_buffer> buffers_;

  // Guards queue_, sentOfFront_, writing_, authenticated_, lastWrite_, the descriptor's closing
  // and refusal_'s setting.
  std::mutex mutex_;
  std::deque<std::unique_ptr<EncodedMessage>> queue_;
  std::size_t sentOfFront_ = 0;  // bytes of queue_.front() that enqueue() wrote itself
  bool writing_ = false;
  bool authenticated_ = false;  // until then queued messages wait
  std::string refusal_;         // non-empty: close once the queue is written (set under mutex_)
  Clock::time_point lastWrite_ = Clock::now();
};

class AsioTransport final : public Transport {
 public:
  AsioTransport(const TransportOptions& options, TransportHandlers handlers);
  ~AsioTransport() override;

  NodeId node() const override { return options_.node; }
  std::string address() const override { return address_; }
  std::string linkAddress(NodeId node) const override;
  void connect(NodeId node, const std::string& address) override;
  void waitForPeer(NodeId node, std::chrono::milliseconds timeout) override;
  void send(NodeId node, OutgoingMessage message) override;
  kernels::Tensor sendBuffer(NodeId node, kernels::Shape shape, kernels::DType dtype) override;
  kernels::Tensor sharedBuffer(NodeId node, kernels::Shape shape, kernels::DType dtype) override;

  // For connections.
  const TransportOptions& options() const { return options_; }
  asio::io_context& io() { return io_; }
  BufferPool& pool() { return *pool_; }
  const std::shared_ptr<spdlog::logger>& log() const { return log_; }
  // The Hello this node sends; with its shared arena when `sameHost`.
  std::unique_ptr<EncodedMessage> helloMessage(bool sameHost, int lane = 0);
  // A frame of the transport's own (no tensors), from this node, filled in by fill(frame).
  template <typename Fill>
  std::unique_ptr<EncodedMessage> controlMessage(Fill fill) {
    OutgoingMessage message;
    auto frame = message.frame();
    frame.setSourceNode(options_.node);
    fill(frame);
    return std::make_unique<EncodedMessage>(
        encodeMessage(std::shared_ptr<OutgoingMessage::State>(message.takeState()), limits_));
  }
  // Registers the link to `node`; returns the link already registered for it, if any (then
  // `connection` is not registered).
  std::shared_ptr<Connection> registerLink(NodeId node,
                                           const std::shared_ptr<Connection>& connection);
  std::shared_ptr<Connection> linkTo(NodeId node) const { return link(node); }
  // Registers an extra connection (lane > 0) of the link to `node`; returns the one registered
  // for that lane already, if any (then `connection` is not registered).
  std::shared_ptr<Connection> registerLane(NodeId node, int lane,
                                           const std::shared_ptr<Connection>& connection);
  int connections(NodeId node) const override;
  // A connection accepted by `listener` authenticated or closed. Any thread.
  void releasePending(Listener listener);
  // A connection accepted by `listener` was refused (see AcceptGate::refused): counted, and
  // logged at a bounded rate. Any thread.
  void refused(Listener listener, std::string_view kind, const std::string& from,
               const std::string& why, std::string line);
  void deliver(NodeId node, IncomingMessage message) { handlers_.onMessage(node, message); }
  // `reported`: its listener's refusal report has it, so it logs no line of its own.
  void onClosed(const std::shared_ptr<Connection>& connection, const std::string& why, bool error,
                bool reported);

 private:
  std::shared_ptr<Connection> link(NodeId node) const;  // null if none
  void listen();
  // The accept loop of a listener, through its AcceptGate; each accepted socket goes to admit().
  template <typename Acceptor>
  void accept(Acceptor& acceptor, Listener listener);
  // Adopts an accepted socket, or refuses it (a Unix peer of another user).
  void admit(Socket socket, Listener listener);
  void adopt(Socket socket, const std::string& remote, Listener listener);
  AcceptGate& gate(Listener listener) {
    return listener == Listener::kTcp ? *tcpGate_ : *unixGate_;
  }
  std::shared_ptr<Socket> dial(const Endpoint& endpoint, Clock::time_point deadline,
                               asio::error_code& error);

  asio::io_context io_;  // first: destroyed last, after everything that holds its sockets
  TransportOptions options_;
  TransportHandlers handlers_;
  EncodeLimits limits_;
  std::shared_ptr<BufferPool> pool_;
  std::shared_ptr<spdlog::logger> log_;
  std::shared_ptr<SharedArena> arena_;  // null: none (no Unix socket, disabled, or unavailable)
  std::optional<asio::executor_work_guard<asio::io_context::executor_type>> work_;
  asio::ip::tcp::acceptor tcpAcceptor_;
  asio::local::stream_protocol::acceptor unixAcceptor_;
  Strand acceptStrand_;  // the accept loops and their gates
  std::unique_ptr<AcceptGate> tcpGate_, unixGate_;
  std::string unixPath_;  // "@name": abstract
  std::string address_;
  std::vector<std::thread> threads_;
  std::atomic<bool> stopping_{false};

  mutable std::mutex mutex_;  // guards links_ and all_
  std::condition_variable linked_;
  std::map<NodeId, std::shared_ptr<Connection>> links_;
  std::map<NodeId, std::string> lost_;  // why each node's link was lost
  // Nodes whose loss was reported (onPeerLost) since they were last linked: a link of several
  // connections is lost once, not once a connection.
  std::set<NodeId> reported_lost_;
  std::map<NodeId, std::map<int, std::shared_ptr<Connection>>> lanes_;  // extra connections
  std::set<std::shared_ptr<Connection>> all_;
};

// ---- Connection ----

Connection::Connection(AsioTransport& owner, Socket socket, std::string remote,
                       std::optional<NodeId> expected, Listener listener, int lane)
    : owner_(owner),
      socket_(std::move(socket)),
      strand_(asio::make_strand(owner.io())),
      remote_(std::move(remote)),
      expected_(expected),
      unix_(remote_.rfind("unix://", 0) == 0),
      listener_(listener),
      lane_(lane),
      handshake_(owner.options().secret, owner.options().runId, expected.has_value()),
      authTimer_(owner.io()),
      heartbeatTimer_(owner.io()) {}

void Connection::start(std::shared_ptr<std::promise<void>> helloWaiter) {
  asio::post(strand_, [self = shared_from_this(), helloWaiter = std::move(helloWaiter)]() mutable {
    self->helloWaiter_ = std::move(helloWaiter);
    if (self->closed_) {
      if (self->helloWaiter_) {
        self->helloWaiter_->set_exception(
            std::make_exception_ptr(IoError("link closed before the Hello")));
        self->helloWaiter_.reset();
      }
      return;
    }
    self->handshake();
  });
}

void Connection::enqueue(std::unique_ptr<EncodedMessage> message) {
  std::lock_guard lock(mutex_);
  if (closed_) {
    // A link that had met its peer is lost, whether or not the transport has moved it to its lost
    // links yet (onClosed runs after this flag is set): the caller names the peer as for a send
    // after that (LinkLostError), not as for a node never linked.
    const std::string what = "transport: the link to node " + peerName() + " (" + remote_ +
                             ") is " + (closedWhy_.empty() ? "closed" : "lost: " + closedWhy_);
    if (identified_) throw LinkLostError(what);
    throw IoError(what);
  }
  if (!writing_ && authenticated_ && refusal_.empty()) {
    // Nothing is being written (so nothing waits in queue_): the calling thread writes what the
    // socket takes at once. That spares a wake-up of the io thread per message, tens of
    // microseconds on a busy machine, on every step's critical path; the rest goes on the strand.
    const std::size_t sent = writeNow(*message);
    if (sent == message->bytes) {
      lastWrite_ = Clock::now();
      return;
    }
    sentOfFront_ = sent;
  }
  queue_.push_back(std::move(message));
  if (!writing_ && authenticated_) {
    writing_ = true;
    asio::post(strand_, [self = shared_from_this()] { self->startWrite(); });
  }
}

std::size_t Connection::writeNow(const EncodedMessage& message) {
  std::array<iovec, 64> iov{};
  std::size_t count = 0;
  for (const auto piece : message.pieces) {
    if (piece.empty()) continue;
    if (count == iov.size()) return 0;  // a message of many parts: the strand writes it
    iov[count++] = {const_cast<std::byte*>(piece.data()), piece.size()};
  }
  msghdr header{};
  header.msg_iov = iov.data();
  header.msg_iovlen = count;
  const ssize_t sent = ::sendmsg(socket_.native_handle(), &header, MSG_DONTWAIT | MSG_NOSIGNAL);
  // Would block, or failed: the strand writes it all and, if the link is broken, says so.
  return sent > 0 ? static_cast<std::size_t>(sent) : 0;
}

void Connection::close(const std::string& why, bool error) {
  asio::post(strand_, [self = shared_from_this(), why, error] { self->closeOnStrand(why, error); });
}

void Connection::handshake() {
  // A stranger that connects and stays silent holds a descriptor and a listener's slot: an
  // accepted connection gets a short deadline; one we dialled waits as long as connect() does.
  const auto timeout = listener_ == Listener::kNone ? owner_.options().connectTimeout
                                                    : owner_.options().handshakeTimeout;
  authTimer_.expires_after(timeout);
  authTimer_.async_wait(asio::bind_executor(
      strand_, [self = shared_from_this(), timeout](const asio::error_code& error) {
        if (error || self->closed_) return;
        self->closeOnStrand(
            fmt::format("refused: no authentication handshake within {} ms", timeout.count()), true,
            kRefusedNoHandshake);
      }));
  exchange(asio::buffer(handshake_.challenge()), asio::buffer(peerChallenge_),
           &Connection::onChallenge);
}

void Connection::exchange(asio::const_buffer mine, asio::mutable_buffer theirs,
                          void (Connection::*next)(const asio::error_code&)) {
  asio::async_write(
      socket_, mine,
      asio::bind_executor(strand_, [self = shared_from_this(), theirs, next](
                                       const asio::error_code& error, std::size_t) {
        if (error) return self->failRead(error, "in the authentication handshake");
        asio::async_read(
            self->socket_, theirs,
            asio::bind_executor(self->strand_, [self, next](const asio::error_code& e,
                                                            std::size_t) { ((*self).*next)(e); }));
      }));
}

void Connection::onChallenge(const asio::error_code& error) {
  if (error) return failRead(error, "in the authentication handshake");
  try {
    handshake_.peerChallenge(peerChallenge_);
  } catch (const InputError& e) {
    return closeOnStrand(std::string("refused: ") + e.what(), true, kRefusedNotAPeer);
  }
  proof_ = handshake_.proof();
  exchange(asio::buffer(proof_), asio::buffer(peerProof_), &Connection::onProof);
}

void Connection::onProof(const asio::error_code& error) {
  if (error) return failRead(error, "in the authentication handshake");
  if (!handshake_.verify(peerProof_)) {
    return closeOnStrand(
        "refused: authentication failed (the peer lacks this run's secret, or belongs to "
        "another run)",
        true, kRefusedAuthentication);
  }
  authTimer_.cancel();
  releaseListener();
  lastRead_ = Clock::now();
  heartbeat();
  {
    std::lock_guard lock(mutex_);
    authenticated_ = true;
    if (!queue_.empty() && !writing_) {
      writing_ = true;
      asio::post(strand_, [self = shared_from_this()] { self->startWrite(); });
    }
  }
  readHeader();
}

void Connection::heartbeat() {
  const auto& options = owner_.options();
  if (options.heartbeatInterval.count() <= 0 || closed_) return;
  const auto now = Clock::now();
  if (options.peerTimeout.count() > 0 && now - lastRead_ > options.peerTimeout) {
    return closeOnStrand(
        fmt::format("nothing arrived for {} ms, not even a heartbeat: the process hangs, or the "
                    "link is cut",
                    std::chrono::duration_cast<std::chrono::milliseconds>(now - lastRead_).count()),
        true);
  }
  bool idle = false;
  {
    std::lock_guard lock(mutex_);
    idle = !writing_ && queue_.empty() && now - lastWrite_ >= options.heartbeatInterval;
  }
  if (idle && identified_) {
    enqueue(owner_.controlMessage([](wire::Frame::Builder f) { f.setHeartbeat(); }));
  }
  heartbeatTimer_.expires_after(options.heartbeatInterval);
  heartbeatTimer_.async_wait(
      asio::bind_executor(strand_, [self = shared_from_this()](const asio::error_code& error) {
        if (!error) self->heartbeat();
      }));
}

void Connection::readHeader() {
  asio::async_read(socket_, asio::buffer(header_),
                   asio::bind_executor(strand_, [self = shared_from_this()](
                                                    const asio::error_code& error, std::size_t n) {
                     self->onHeader(error, n);
                   }));
}

void Connection::failRead(const asio::error_code& error, const std::string& during) {
  if (closed_) return;
  if (error == asio::error::eof) {
    closeOnStrand("peer closed the connection " + during, true);
  } else {
    closeOnStrand("read failed " + during + ": " + error.message(), true);
  }
}

void Connection::onHeader(const asio::error_code& error, std::size_t got) {
  if (error) {
    if (closed_) return;
    // At a frame boundary a close is clean; a reset too (the peer closed with our last frames
    // unread in its socket, which a Unix socket reports as a reset).
    if ((error == asio::error::eof || error == asio::error::connection_reset) && got == 0 &&
        !bulk_.message) {
      closeOnStrand("peer closed the connection", false);
    } else {
      failRead(error, fmt::format("mid-frame (after {} of {} header bytes{})", got,
                                  kFrameHeaderBytes, bulk_.message ? ", bulk pending" : ""));
    }
    return;
  }
  lastRead_ = Clock::now();
  std::byte* into = nullptr;
  try {
    frame_ = decodeFrameHeader(header_.data(), owner_.options().maxFrameBytes);
    if (frame_.kind == FrameKind::kBulk) into = bulkChunkTarget(bulk_, frame_);
  } catch (const InputError& e) {
    closeOnStrand(e.what(), true);
    return;
  }
  auto self = shared_from_this();
  if (frame_.kind == FrameKind::kMessage) {
    if (bulk_.message) {
      closeOnStrand("a message frame arrived while bulk parts were pending", true);
      return;
    }
    table_.assign(segmentTableBytes(frame_.count), std::byte{0});
    asio::async_read(socket_, asio::buffer(table_),
                     asio::bind_executor(strand_, [self](const asio::error_code& e, std::size_t) {
                       self->onTable(e);
                     }));
    return;
  }
  asio::async_read(socket_, asio::buffer(into, frame_.bytes),
                   asio::bind_executor(strand_, [self](const asio::error_code& e, std::size_t) {
                     self->onBulk(e);
                   }));
}

void Connection::onTable(const asio::error_code& error) {
  if (error) return failRead(error, "mid-frame (in the segment table)");
  std::shared_ptr<IncomingMessage::State> state;
  try {
    state = startMessage(frame_, table_.data(), owner_.pool());
  } catch (const InputError& e) {
    closeOnStrand(e.what(), true);
    return;
  } catch (const std::bad_alloc&) {
    closeOnStrand(fmt::format("cannot allocate a frame of {} bytes", frame_.bytes), true);
    return;
  }
  asio::async_read(
      socket_, asio::buffer(state->buffer.get(), state->bufferBytes),
      asio::bind_executor(strand_, [self = shared_from_this(), state](const asio::error_code& e,
                                                                      std::size_t) mutable {
        self->onPayload(e, std::move(state));
      }));
}

void Connection::onPayload(const asio::error_code& error,
                           std::shared_ptr<IncomingMessage::State> state) {
  if (error) return failRead(error, "mid-frame (in the message)");
  lastRead_ = Clock::now();
  try {
    parseMessage(*state, owner_.options());
    auto frame = state->reader->getRoot<wire::Frame>();
    if (frame.isRefusal()) {
      closeOnStrand(fmt::format("node {} at {} refused the link: {}",
                                expected_ ? std::to_string(*expected_) : peerName(), remote_,
                                frame.getRefusal().cStr()),
                    true);
    } else if (!refusal_.empty()) {
      // refused: nothing more of this peer is read
    } else if (frame.isHello()) {
      onHello(frame.getHello());
    } else if (!identified_) {
      closeOnStrand("the first frame on a link was not a Hello", true);
    } else if (frame.isArenaMapped()) {
      peerMappedArena_ = true;
    } else if (frame.isHeartbeat()) {
      // lastRead_ has moved on; that is all a heartbeat is for
    } else if (!takeSharedParts(frame, *state)) {
      // closed, saying why
    } else if (frame.getBulk().size() == 0) {
      deliver(std::move(state));
    } else {
      planBulkParts(*state, owner_.options());
      state->bulk = owner_.pool().allocate(state->bulkBytes);
      bulk_ = {std::move(state)};
      if (auto complete = advanceBulk(bulk_, 0)) deliver(std::move(complete));
    }
  } catch (const InputError& e) {
    closeOnStrand(e.what(), true);
    return;
  } catch (const kj::Exception& e) {
    closeOnStrand(std::string("malformed message: ") + e.getDescription().cStr(), true);
    return;
  } catch (const std::bad_alloc&) {
    closeOnStrand("cannot allocate the bulk parts a message announces", true);
    return;
  }
  if (!closed_ && refusal_.empty()) readHeader();
}

void Connection::onBulk(const asio::error_code& error) {
  if (error) return failRead(error, "mid-frame (in a bulk chunk)");
  lastRead_ = Clock::now();
  if (auto complete = advanceBulk(bulk_, frame_.bytes)) deliver(std::move(complete));
  if (!closed_) readHeader();
}

void Connection::onHello(wire::Hello::Reader hello) {
  const auto& options = owner_.options();
  const std::string incarnation = hello.getIncarnation().cStr();
  std::string problem;
  std::string_view kind = kRefusedNoHello;
  if (identified_) {
    problem = "a second Hello on one link";
  } else if (std::string(hello.getRunId().cStr()) != options.runId) {
    kind = kRefusedAnotherRun;
    problem =
        fmt::format("peer belongs to run '{}', not '{}'", hello.getRunId().cStr(), options.runId);
  } else if (!options.incarnation.empty() && incarnation != options.incarnation) {
    kind = kRefusedAnotherRun;
    problem = fmt::format(
        "node {} at {} belongs to another run with the same run id '{}' and secret (its "
        "incarnation is '{}', this run's '{}'): two runs started with one --run_id, or a process "
        "of another generation",
        hello.getNode(), remote_, options.runId, incarnation, options.incarnation);
  } else if (expected_ && hello.getNode() != *expected_) {
    problem = fmt::format("expected node {} at {}, but node {} answered", *expected_, remote_,
                          hello.getNode());
  } else if (hello.getNode() == options.node) {
    problem = fmt::format("peer claims this transport's own node id {}", options.node);
  }
  if (!problem.empty()) return refuse(kind, problem);
  node_ = hello.getNode();
  identified_ = true;
  if (!expected_) lane_ = hello.getLane();
  if (lane() > 0) {
    // An extra connection of a link: the link (lane 0) came first, as connect() dials it first.
    if (!owner_.linkTo(node_)) {
      return refuse(kRefusedNoHello, fmt::format("extra connection {} of node {} from {} before "
                                                 "its link",
                                                 lane(), node(), remote_));
    }
    if (!expected_) enqueue(owner_.helloMessage(false, lane()));
    if (auto existing = owner_.registerLane(node_, lane(), shared_from_this())) {
      return refuse(kRefusedAnotherRun,
                    fmt::format("node {} has an extra connection {} already (at {}); a second "
                                "one comes from {}",
                                node(), lane(), existing->remote(), remote_));
    }
    if (helloWaiter_) {
      helloWaiter_->set_value();
      helloWaiter_.reset();
    }
    return;
  }
  const auto alreadyLinked = [&](const std::shared_ptr<Connection>& existing) {
    refuse(
        kRefusedAnotherRun,
        fmt::format(
            "node {} is linked already (at {}), and a second process claims to be node {} from {}: "
            "two runs with one run id, or a process of an earlier start still running",
            node(), existing->remote(), node(), remote_));
  };
  if (auto existing = owner_.linkTo(node_)) return alreadyLinked(existing);
  // Our Hello (and arena answer) go first: once the link is registered, other threads may queue
  // messages on it.
  if (!expected_) enqueue(owner_.helloMessage(unix_));
  mapPeerArena(hello);
  if (auto existing = owner_.registerLink(node_, shared_from_this())) {
    return alreadyLinked(existing);  // lost a race with another claimant
  }
  if (helloWaiter_) {
    helloWaiter_->set_value();
    helloWaiter_.reset();
  }
}

void Connection::refuse(std::string_view kind, const std::string& why) {
  {
    std::lock_guard lock(mutex_);  // enqueue() reads it on other threads
    refusal_ = why;
  }
  std::string line = fmt::format("refused the link from {}: {}", remote_, why);
  if (listener_ == Listener::kNone) {
    owner_.log()->error("transport node {}: {}", owner_.options().node, line);
  } else {
    // Accepted: whoever connects may come in numbers.
    owner_.refused(listener_, kind, remote_, "refused: " + why, std::move(line));
  }
  enqueue(owner_.controlMessage([&](wire::Frame::Builder f) { f.setRefusal(why); }));
  // A peer that does not read its refusal is cut off all the same.
  authTimer_.expires_after(owner_.options().handshakeTimeout);
  authTimer_.async_wait(
      asio::bind_executor(strand_, [self = shared_from_this()](const asio::error_code& error) {
        if (!error) self->closeOnStrand("refused: " + self->refusal_, false);
      }));
}

void Connection::releaseListener() {
  if (listener_ == Listener::kNone || listenerReleased_) return;
  listenerReleased_ = true;
  owner_.releasePending(listener_);
}

void Connection::mapPeerArena(wire::Hello::Reader hello) {
  if (!unix_ || !hello.hasArenaPath() || hello.getArenaPath().size() == 0) return;
  const std::string path = hello.getArenaPath().cStr();
  try {
    peerArena_ = PeerArena::open(path, hello.getArenaToken(), hello.getArenaBytes());
  } catch (const Error& e) {
    owner_.log()->info(
        "transport node {}: no shared memory with node {} ({}); tensors go through the socket",
        owner_.options().node, node(), e.what());
    return;
  }
  enqueue(owner_.controlMessage([](wire::Frame::Builder f) { f.setArenaMapped(); }));
}

bool Connection::takeSharedParts(wire::Frame::Reader frame, IncomingMessage::State& state) {
  const auto parts = frame.getShared();
  if (parts.size() == 0) return true;
  if (!peerArena_) {
    closeOnStrand("a message names shared-memory parts, but this link has no shared arena", true);
    return false;
  }
  try {
    for (auto part : parts) {
      state.shared.push_back(peerArena_->take(part.getOffset(), part.getBytes()));
      state.sharedSizes.push_back(part.getBytes());
    }
  } catch (const InputError& e) {
    closeOnStrand(e.what(), true);
    return false;
  }
  return true;
}

void Connection::deliver(std::shared_ptr<IncomingMessage::State> state) {
  std::string problem;
  try {
    owner_.deliver(node_, IncomingMessage(std::move(state)));
  } catch (const kj::Exception& e) {
    problem = e.getDescription().cStr();
  } catch (const std::exception& e) {
    problem = e.what();
  }
  if (!problem.empty()) closeOnStrand("the message handler threw: " + problem, true);
  // Time spent in the handler (waiting for room in a mailbox) is not the peer's silence.
  lastRead_ = Clock::now();
}

void Connection::closeOnStrand(const std::string& why, bool error, std::string_view kind) {
  if (closed_.exchange(true)) return;
  // An accepted connection that never became a link is a refusal, counted by its listener;
  // refuse() counted it already.
  const bool refusedHere = listener_ != Listener::kNone && !identified_ && refusal_.empty();
  const bool reported = refusedHere || (listener_ != Listener::kNone && !refusal_.empty());
  if (refusedHere) {
    if (kind.empty()) kind = listenerReleased_ ? kRefusedNoHello : kRefusedClosedEarly;
    owner_.refused(listener_, kind, remote_, why,
                   fmt::format("dropped the link to node ? ({}): {}", remote_, why));
  }
  releaseListener();
  authTimer_.cancel();
  heartbeatTimer_.cancel();
  {
    // Under the lock: enqueue() writes to the descriptor from other threads, and must not write
    // to one that is closed and perhaps already reused.
    std::lock_guard lock(mutex_);
    closedWhy_ = why;
    asio::error_code ignored;
    socket_.shutdown(asio::socket_base::shutdown_both, ignored);
    socket_.close(ignored);
    queue_.clear();
  }
  bulk_ = {};
  if (helloWaiter_) {
    helloWaiter_->set_exception(std::make_exception_ptr(IoError(why)));
    helloWaiter_.reset();
  }
  owner_.onClosed(shared_from_this(), why, error, reported);
}

void Connection::startWrite() {
  std::size_t skip = 0;  // of the first message, written by enqueue() already
  {
    std::lock_guard lock(mutex_);
    if (closed_ || queue_.empty()) {
      writing_ = false;
      return;
    }
    while (!queue_.empty()) {
      inflight_.push_back(std::move(queue_.front()));
      queue_.pop_front();
    }
    skip = std::exchange(sentOfFront_, 0);
  }
  buffers_.clear();
  for (const auto& message : inflight_) {
    for (auto piece : message->pieces) {
      const std::size_t skipped = std::min(skip, piece.size());
      skip -= skipped;
      if (skipped < piece.size())
        buffers_.emplace_back(piece.data() + skipped, piece.size() - skipped);
    }
  }
  asio::async_write(socket_, buffers_,
                    asio::bind_executor(strand_, [self = shared_from_this()](
                                                     const asio::error_code& error, std::size_t) {
                      self->onWritten(error);
                    }));
}

void Connection::onWritten(const asio::error_code& error) {
  inflight_.clear();
  buffers_.clear();
  {
    std::lock_guard lock(mutex_);
    lastWrite_ = Clock::now();
  }
  if (error == asio::error::broken_pipe || error == asio::error::connection_reset) {
    // The peer closed its end. Whether that was a clean close is for the read side to say (it
    // sees the end at a frame boundary or mid-frame); nothing more is written (writing_ stays set).
    if (refusal_.empty()) return;
  }
  if (error) {
    if (!closed_) closeOnStrand("write failed: " + error.message(), true);
    std::lock_guard lock(mutex_);
    writing_ = false;
    return;
  }
  if (!refusal_.empty()) {
    bool drained = false;
    {
      std::lock_guard lock(mutex_);
      drained = queue_.empty();
    }
    if (drained) return closeOnStrand("refused: " + refusal_, false);  // logged by refuse()
  }
  startWrite();
}

// ---- AsioTransport ----

AsioTransport::AsioTransport(const TransportOptions& options, TransportHandlers handlers)
    : options_(options),
      handlers_(std::move(handlers)),
      pool_(std::make_shared<BufferPool>(options.receivePoolBytes)),
      log_(options.logger ? options.logger : spdlog::default_logger()),
      tcpAcceptor_(io_),
      unixAcceptor_(io_),
      acceptStrand_(asio::make_strand(io_)) {
  if (!handlers_.onMessage) throw InputError("transport: TransportHandlers::onMessage is not set");
  if (!handlers_.onPeerLost) handlers_.onPeerLost = [](NodeId, const std::string&) {};
  if (options_.maxFrameBytes < 4096) {
    throw InputError(fmt::format("transport: maxFrameBytes {} is below the minimum of 4096",
                                 options_.maxFrameBytes));
  }
  if (options_.ioThreads < 1) throw InputError("transport: ioThreads must be at least 1");
  limits_ = {options_.maxFrameBytes, options_.inlineTensorBytes, options_.bulkChunkBytes};
  listen();
  if (options_.unixSocket && options_.sharedArenaBytes > 0) {
    std::string why;
    arena_ = SharedArena::create(options_.sharedArenaBytes, &why);
    if (!arena_) {
      log_->info(
          "transport node {}: no shared-memory arena ({}); same-host tensors go through "
          "the socket",
          options_.node, why);
    }
  }
  work_.emplace(io_.get_executor());
  for (int t = 0; t < options_.ioThreads; ++t) {
    threads_.emplace_back([this] {
      for (;;) {
        try {
          io_.run();
          return;
        } catch (const std::exception& e) {
          log_->error("transport node {}: an I/O handler threw: {}", options_.node, e.what());
        }
      }
    });
  }
}

AsioTransport::~AsioTransport() {
  stopping_ = true;
  std::vector<std::shared_ptr<Connection>> connections;
  {
    std::lock_guard lock(mutex_);
    connections.assign(all_.begin(), all_.end());
  }
  asio::post(acceptStrand_, [this] {
    asio::error_code ignored;
    tcpAcceptor_.close(ignored);
    unixAcceptor_.close(ignored);
    tcpGate_->close();
    if (unixGate_) unixGate_->close();
  });
  for (auto& c : connections)
    c->close("transport shut down", false);
  work_.reset();
  io_.stop();
  for (auto& t : threads_)
    t.join();
  {
    std::lock_guard lock(mutex_);
    links_.clear();
    all_.clear();
  }
  connections.clear();
}

void AsioTransport::listen() {
  std::string interface = options_.interface;
  if (interface.empty()) {
    if (const char* env = std::getenv("TROUPE_INTERFACE")) interface = env;
  }
  std::string bindIp = options_.host.empty() ? "0.0.0.0" : options_.host;
  std::string advertise = bindIp;
  if (!interface.empty()) {
    bindIp = advertise = resolveInterface(interface);
  } else if (options_.host.empty()) {
    // Listen where peers are told to come, not on every interface.
    bindIp = advertise = "127.0.0.1";
    for (const auto& i : listInterfaces()) {
      if (!i.ipv4.empty() && i.ipv4.rfind("127.", 0) != 0) {
        bindIp = advertise = i.ipv4;
        break;
      }
    }
  }
  asio::error_code error;
  const auto ip = asio::ip::make_address(bindIp, error);
  if (error) throw InputError("transport: bad listen address '" + bindIp + "'");
  const asio::ip::tcp::endpoint endpoint(ip, options_.port);
  tcpAcceptor_.open(endpoint.protocol(), error);
  if (!error) tcpAcceptor_.set_option(asio::socket_base::reuse_address(true), error);
  if (!error) tcpAcceptor_.bind(endpoint, error);
  if (!error) tcpAcceptor_.listen(asio::socket_base::max_listen_connections, error);
  if (!error) setCloseOnExec(tcpAcceptor_.native_handle());
  if (error) {
    throw IoError(fmt::format("transport node {}: cannot listen on tcp://{}:{}: {}", options_.node,
                              bindIp, options_.port, error.message()));
  }
  address_ = fmt::format("tcp://{}:{}", advertise, tcpAcceptor_.local_endpoint().port());
  tcpGate_ = std::make_unique<AcceptGate>(
      acceptStrand_, fmt::format("transport node {} {}", options_.node, address_),
      options_.maxPendingHandshakes, log_);
  asio::post(acceptStrand_, [this] { accept(tcpAcceptor_, Listener::kTcp); });

  if (options_.unixSocket) {
    // Abstract: nothing on disk to plant, rename or leave behind; random, so that no other run
    // (or stale process) of the same run id answers under this name.
    std::random_device random;
    const std::uint64_t nonce = (std::uint64_t{random()} << 32) | random();
    const std::string path = fmt::format("@troupe-{}-node{}-{:016x}", options_.runId.substr(0, 48),
                                         options_.node, nonce);
    const auto local = unixEndpoint(path);
    unixAcceptor_.open(local.protocol(), error);
    if (!error) unixAcceptor_.bind(local, error);
    if (!error) unixAcceptor_.listen(asio::socket_base::max_listen_connections, error);
    if (!error) setCloseOnExec(unixAcceptor_.native_handle());
    if (error) {
      throw IoError(fmt::format("transport node {}: cannot listen on unix://{}: {}", options_.node,
                                path, error.message()));
    }
    unixPath_ = path;
    address_ += ";unix://" + path;
    unixGate_ = std::make_unique<AcceptGate>(
        acceptStrand_, fmt::format("transport node {} unix://{}", options_.node, path),
        options_.maxPendingHandshakes, log_);
    asio::post(acceptStrand_, [this] { accept(unixAcceptor_, Listener::kUnix); });
  }
}

template <typename Acceptor>
void AsioTransport::accept(Acceptor& acceptor, Listener listener) {
  gate(listener).next([this, &acceptor, listener] {
    auto socket = std::make_shared<Socket>(io_);
    acceptor.async_accept(
        *socket, asio::bind_executor(acceptStrand_, [this, socket, &acceptor,
                                                     listener](const asio::error_code& error) {
          if (error == asio::error::operation_aborted || stopping_) return;
          if (error) {
            gate(listener).failed(error);
          } else {
            gate(listener).accepted();
            admit(std::move(*socket), listener);
          }
          accept(acceptor, listener);
        }));
  });
}

void AsioTransport::admit(Socket socket, Listener listener) {
  asio::error_code ignored;
  if (listener == Listener::kTcp) {
    socket.set_option(asio::ip::tcp::no_delay(true), ignored);
    const std::string remote = describe(socket.remote_endpoint(ignored), "tcp://?");
    return adopt(std::move(socket), remote, listener);
  }
  // Who is at the other end of a Unix socket: the kernel says, whatever the peer claims.
  ucred peer{};
  socklen_t length = sizeof peer;
  ::getsockopt(socket.native_handle(), SOL_SOCKET, SO_PEERCRED, &peer, &length);
  const std::string remote =
      fmt::format("unix://{} (accepted from pid {}, uid {})", unixPath_, peer.pid, peer.uid);
  if (peer.uid == ::geteuid()) return adopt(std::move(socket), remote, listener);
  const std::string why = fmt::format(
      "not this process's user (uid {}); only the run's own processes may link through its Unix "
      "socket",
      ::geteuid());
  gate(listener).refused(kRefusedAnotherUser, remote, why,
                         fmt::format("refused {}: {}", remote, why));
  socket.close(ignored);
  gate(listener).release();
}

void AsioTransport::adopt(Socket socket, const std::string& remote, Listener listener) {
  setCloseOnExec(socket.native_handle());
  auto connection =
      std::make_shared<Connection>(*this, std::move(socket), remote, std::nullopt, listener);
  {
    std::lock_guard lock(mutex_);
    all_.insert(connection);
  }
  connection->start(nullptr);
}

void AsioTransport::releasePending(Listener listener) {
  asio::post(acceptStrand_, [this, listener] {
    if (!stopping_) gate(listener).release();
  });
}

void AsioTransport::refused(Listener listener, std::string_view kind, const std::string& from,
                            const std::string& why, std::string line) {
  if (stopping_) return;
  asio::post(acceptStrand_, [this, listener, kind, from, why, line = std::move(line)] {
    if (!stopping_) gate(listener).refused(kind, from, why, line);
  });
}

std::unique_ptr<EncodedMessage> AsioTransport::helloMessage(bool sameHost, int lane) {
  return controlMessage([&](wire::Frame::Builder frame) {
    auto hello = frame.initHello();
    hello.setNode(options_.node);
    hello.setLane(static_cast<std::uint8_t>(lane));
    hello.setRunId(options_.runId);
    hello.setIncarnation(options_.incarnation);
    hello.setAddress(address_);
    if (sameHost && arena_) {
      hello.setArenaPath(arena_->path());
      hello.setArenaToken(arena_->token());
      hello.setArenaBytes(arena_->bytes());
    }
  });
}

std::shared_ptr<Connection> AsioTransport::registerLink(
    NodeId node, const std::shared_ptr<Connection>& connection) {
  {
    std::lock_guard lock(mutex_);
    auto [it, added] = links_.try_emplace(node, connection);
    if (!added) return it->second;
    lost_.erase(node);  // linked again: sends go to the new link
    reported_lost_.erase(node);
  }
  linked_.notify_all();
  return nullptr;
}

std::shared_ptr<Connection> AsioTransport::registerLane(
    NodeId node, int lane, const std::shared_ptr<Connection>& connection) {
  std::lock_guard lock(mutex_);
  auto [it, added] = lanes_[node].try_emplace(lane, connection);
  return added ? nullptr : it->second;
}

int AsioTransport::connections(NodeId node) const {
  std::lock_guard lock(mutex_);
  if (!links_.count(node)) return 0;
  const auto it = lanes_.find(node);
  return 1 + (it == lanes_.end() ? 0 : static_cast<int>(it->second.size()));
}

void AsioTransport::onClosed(const std::shared_ptr<Connection>& connection, const std::string& why,
                             bool error, bool reported) {
  bool wasLink = false;
  {
    std::lock_guard lock(mutex_);
    all_.erase(connection);
    auto it = connection->identified() ? links_.find(connection->node()) : links_.end();
    if (it != links_.end() && it->second == connection) {
      links_.erase(it);
      lost_[connection->node()] = why;
      wasLink = true;
    }
    // An extra connection lost is the link lost: its messages had nowhere else to go.
    if (auto lanes = connection->identified() ? lanes_.find(connection->node()) : lanes_.end();
        lanes != lanes_.end()) {
      auto lane = lanes->second.find(connection->lane());
      if (lane != lanes->second.end() && lane->second == connection) {
        lanes->second.erase(lane);
        wasLink = true;
      }
      if (lanes->second.empty()) lanes_.erase(lanes);
    }
    if (wasLink && !reported_lost_.insert(connection->node()).second) wasLink = false;
  }
  if (stopping_) return;
  if (reported) {
    if (wasLink) handlers_.onPeerLost(connection->node(), why);
    return;
  }
  const std::string line =
      fmt::format("transport node {}: dropped the link to node {} ({}): {}", options_.node,
                  connection->peerName(), connection->remote(), why);
  // A peer that closes its end in order is a process that finished (every clean end of a run):
  // said at debug. Whether the loss matters is the peer-lost handler's to say, naming the peer.
  if (error) {
    log_->error(line);
  } else {
    log_->debug(line);
  }
  if (wasLink) handlers_.onPeerLost(connection->node(), why);
}

std::shared_ptr<Connection> AsioTransport::link(NodeId node) const {
  std::lock_guard lock(mutex_);
  auto it = links_.find(node);
  return it == links_.end() ? nullptr : it->second;
}

std::string AsioTransport::linkAddress(NodeId node) const {
  auto connection = link(node);
  return connection ? connection->remote() : "";
}

std::shared_ptr<Socket> AsioTransport::dial(const Endpoint& endpoint, Clock::time_point deadline,
                                            asio::error_code& error) {
  auto socket = std::make_shared<Socket>(io_);
  auto done = std::make_shared<std::promise<asio::error_code>>();
  auto result = done->get_future();
  asio::post(io_, [socket, endpoint, done] {
    socket->async_connect(endpoint, [done](const asio::error_code& e) { done->set_value(e); });
  });
  if (result.wait_until(deadline) == std::future_status::timeout) {
    asio::post(io_, [socket] {
      asio::error_code ignored;
      socket->close(ignored);
    });
    result.wait();
    error = asio::error::timed_out;
    return nullptr;
  }
  error = result.get();
  return error ? nullptr : socket;
}

void AsioTransport::connect(NodeId node, const std::string& address) {
  if (node == options_.node) {
    throw InputError(fmt::format("transport: node {} cannot connect to itself", node));
  }
  {
    std::lock_guard lock(mutex_);
    if (links_.count(node)) return;
  }
  const ParsedAddress parsed = parseAddress(address);
  std::vector<std::pair<Endpoint, std::string>> candidates;
  if (!parsed.unixPath.empty() && (parsed.tcpHost.empty() || isLocalHost(parsed.tcpHost))) {
    candidates.emplace_back(Endpoint(unixEndpoint(parsed.unixPath)), "unix://" + parsed.unixPath);
  }
  if (!parsed.tcpHost.empty()) {
    asio::error_code error;
    asio::ip::tcp::resolver resolver(io_);
    auto results = resolver.resolve(parsed.tcpHost, parsed.tcpPort, error);
    if (error || results.empty()) {
      throw InputError(fmt::format("transport: cannot resolve {}:{} (node {}): {}", parsed.tcpHost,
                                   parsed.tcpPort, node, error.message()));
    }
    const auto endpoint = results.begin()->endpoint();
    candidates.emplace_back(Endpoint(endpoint), describe(Endpoint(endpoint), "tcp://?"));
  }

  const auto deadline = Clock::now() + options_.connectTimeout;
  std::string lastError = "no attempt";
  for (;;) {
    for (const auto& [endpoint, remote] : candidates) {
      asio::error_code error;
      auto socket = dial(endpoint, deadline, error);
      if (!socket) {
        lastError = remote + ": " + error.message();
        continue;
      }
      const bool tcp = remote.rfind("tcp://", 0) == 0;
      // Starts connection `lane` of the link on `socket` and waits for the peer's Hello.
      auto establish = [&](Socket& socket, int lane) {
        setCloseOnExec(socket.native_handle());
        if (tcp) {
          asio::error_code ignored;
          socket.set_option(asio::ip::tcp::no_delay(true), ignored);
        }
        auto connection = std::make_shared<Connection>(*this, std::move(socket), remote, node,
                                                       Listener::kNone, lane);
        {
          std::lock_guard lock(mutex_);
          all_.insert(connection);
        }
        auto hello = std::make_shared<std::promise<void>>();
        auto helloDone = hello->get_future();
        connection->enqueue(helloMessage(!tcp, lane));
        connection->start(std::move(hello));
        if (helloDone.wait_until(deadline) == std::future_status::timeout) {
          connection->close("no Hello before the connect timeout", true);
          throw TimeoutError(
              fmt::format("transport node {}: node {} at {} sent no Hello within {} ms",
                          options_.node, node, remote, options_.connectTimeout.count()));
        }
        try {
          helloDone.get();
        } catch (const IoError& e) {
          throw IoError(fmt::format("transport node {}: connecting to node {} at {} failed: {}",
                                    options_.node, node, remote, e.what()));
        }
      };
      establish(*socket, 0);
      // The link's extra TCP connections, once it stands (the peer knows the node by then).
      for (int lane = 1; tcp && lane < options_.connectionsPerPeer; ++lane) {
        auto extra = dial(endpoint, deadline, error);
        if (!extra) {
          throw IoError(
              fmt::format("transport node {}: extra connection {} to node {} at {} failed: {}",
                          options_.node, lane, node, remote, error.message()));
        }
        establish(*extra, lane);
      }
      return;
    }
    if (Clock::now() + std::chrono::milliseconds(50) >= deadline) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  throw TimeoutError(
      fmt::format("transport node {}: cannot connect to node {} at {} within {} ms "
                  "(last error: {})",
                  options_.node, node, address, options_.connectTimeout.count(), lastError));
}

void AsioTransport::waitForPeer(NodeId node, std::chrono::milliseconds timeout) {
  std::unique_lock lock(mutex_);
  if (!linked_.wait_for(lock, timeout, [&] { return links_.count(node) > 0; })) {
    throw TimeoutError(fmt::format("transport node {}: no link to node {} within {} ms",
                                   options_.node, node, timeout.count()));
  }
}

void AsioTransport::send(NodeId node, OutgoingMessage message) {
  std::shared_ptr<Connection> connection;
  {
    std::lock_guard lock(mutex_);
    if (const auto it = links_.find(node); it != links_.end()) connection = it->second;
    const auto lanes = message.lane() > 0 && connection ? lanes_.find(node) : lanes_.end();
    if (lanes != lanes_.end()) {
      const int lane = message.lane() % (1 + static_cast<int>(lanes->second.size()));
      if (const auto extra = lanes->second.find(lane); extra != lanes->second.end()) {
        connection = extra->second;
      }
    }
  }
  if (!connection) {
    std::string lost;
    {
      std::lock_guard lock(mutex_);
      if (const auto it = lost_.find(node); it != lost_.end()) lost = it->second;
    }
    if (!lost.empty()) {
      throw LinkLostError(fmt::format("transport node {}: the link to node {} is lost: {}",
                                      options_.node, node, lost));
    }
    throw IoError(
        fmt::format("transport node {}: no link to node {} (connect first, or wait "
                    "for its Hello)",
                    options_.node, node));
  }
  auto state = message.takeState();
  if (!state) throw InputError("transport: send of a moved-from message");
  connection->enqueue(std::make_unique<EncodedMessage>(
      encodeMessage(std::shared_ptr<OutgoingMessage::State>(std::move(state)), limits_,
                    connection->peerMappedArena() ? arena_.get() : nullptr)));
}

kernels::Tensor AsioTransport::sendBuffer(NodeId node, kernels::Shape shape, kernels::DType dtype) {
  auto shared = sharedBuffer(node, shape, dtype);
  if (shared.raw() != nullptr) return shared;
  return kernels::Tensor::hostUninitialized(std::move(shape), dtype);
}

kernels::Tensor AsioTransport::sharedBuffer(NodeId node, kernels::Shape shape,
                                            kernels::DType dtype) {
  // Small tensors go inline in their message: the arena's bookkeeping would cost more.
  constexpr std::size_t kMinSharedBytes = std::size_t{64} << 10;
  const std::size_t bytes =
      static_cast<std::size_t>(kernels::numelOf(shape)) * kernels::sizeOf(dtype);
  if (arena_ && bytes >= kMinSharedBytes) {
    auto connection = link(node);
    if (connection && connection->peerMappedArena()) {
      if (auto memory = arena_->allocate(bytes)) {
        void* data = memory.get();
        return kernels::Tensor(std::shared_ptr<void>(std::move(memory), data), data,
                               std::move(shape), dtype, kernels::Device{});
      }
    }
  }
  return {};
}

}  // namespace

std::unique_ptr<Transport> makeTransport(const TransportOptions& options,
                                         TransportHandlers handlers) {
  return std::make_unique<AsioTransport>(options, std::move(handlers));
}

}  // namespace troupe::transport
