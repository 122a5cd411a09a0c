#include "rendezvous/tcp_store.h"

#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <deque>
#include <mutex>
#include <thread>
#include <type_traits>
#include <unordered_map>
#include <unordered_set>

#include <fmt/format.h>
#include <spdlog/spdlog.h>
#include <asio.hpp>

#include "rendezvous/store_util.h"
#include "rendezvous/value.h"
#include "transport/accept_gate.h"
#include "transport/auth.h"
#include "transport/refusal_report.h"
#include "troupe/error.h"

namespace troupe::rendezvous {
namespace {

using std::chrono::milliseconds;
using Clock = std::chrono::steady_clock;

// How long past a call's own timeout a client waits for the reply before giving up on the server.
constexpr milliseconds kReplyGrace{30000};
// A client must have authenticated within this long after connecting, and at most
// kMaxPendingHandshakes connections may be unauthenticated at once (transport/accept_gate.h).
constexpr milliseconds kHandshakeTimeout{5000};
constexpr int kMaxPendingHandshakes = 64;
// How the listener's refusal report counts a client that authenticated and then broke off.
constexpr std::string_view kConnectionFailed = "connection failed";
// Longer timeouts are cut to this, so deadlines never overflow.
constexpr milliseconds kMaxTimeout{std::chrono::hours(24 * 365)};

milliseconds clampTimeout(milliseconds timeout) {
  return std::clamp(timeout, milliseconds(0), kMaxTimeout);
}

enum class Op : uint8_t { kSet = 1, kGet, kAdd, kCheck, kWait, kRemove };
enum class Status : uint8_t { kOk = 0, kTimeout, kError };

// ---- encoding -------------------------------------------------------------------------------

class ProtocolError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

void putU8(std::string& out, uint8_t v) {
  out.push_back(static_cast<char>(v));
}
void putU32(std::string& out, uint32_t v) {
  for (int i = 0; i < 4; ++i)
    out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}
void putU64(std::string& out, uint64_t v) {
  for (int i = 0; i < 8; ++i)
    out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}
void putBytes(std::string& out, std::string_view bytes) {
  putU32(out, static_cast<uint32_t>(bytes.size()));
  out.append(bytes);
}
uint32_t loadU32(const unsigned char* p) {
  return uint32_t{p[0]} | uint32_t{p[1]} << 8 | uint32_t{p[2]} << 16 | uint32_t{p[3]} << 24;
}

// Starts a frame: 4 bytes for the length, patched by finishFrame.
std::string startFrame() {
  return std::string(4, '\0');
}
std::string finishFrame(std::string frame) {
  const auto body = static_cast<uint32_t>(frame.size() - 4);
  for (int i = 0; i < 4; ++i)
    frame[i] = static_cast<char>((body >> (8 * i)) & 0xff);
  return frame;
}

// Reads the fields of one frame body; any overrun or leftover is a ProtocolError.
class Reader {
 public:
  explicit Reader(std::string_view body) : body_(body) {}
  uint8_t u8() { return static_cast<uint8_t>(take(1)[0]); }
  uint32_t u32() { return loadU32(reinterpret_cast<const unsigned char*>(take(4).data())); }
  uint64_t u64() {
    const auto* p = reinterpret_cast<const unsigned char*>(take(8).data());
    uint64_t v = 0;
    for (int i = 7; i >= 0; --i)
      v = v << 8 | p[i];
    return v;
  }
  std::string bytes() { return std::string(take(u32())); }
  std::vector<std::string> keyList() {
    const uint32_t n = u32();
    // Each key takes at least its 4-byte length, so n is bounded by what is left.
    if (n > body_.size() / 4) throw ProtocolError(fmt::format("a list of {} keys overruns", n));
    std::vector<std::string> keys;
    keys.reserve(n);
    for (uint32_t i = 0; i < n; ++i)
      keys.push_back(bytes());
    return keys;
  }
  void end() const {
    if (!body_.empty()) throw ProtocolError(fmt::format("{} trailing bytes", body_.size()));
  }

 private:
  std::string_view take(size_t n) {
    if (n > body_.size()) {
      throw ProtocolError(fmt::format("a field of {} bytes overruns the {} left", n, body_.size()));
    }
    auto out = body_.substr(0, n);
    body_.remove_prefix(n);
    return out;
  }
  std::string_view body_;
};

// ---- server ---------------------------------------------------------------------------------

class ServerImpl;

// One client connection. Lives on the server thread only.
class Session : public std::enable_shared_from_this<Session> {
 public:
  Session(ServerImpl& server, asio::ip::tcp::socket socket);
  // Authenticates the client, then serves it.
  void start();
  // Called when a key this session is parked on has been set.
  void keyAppeared();
  // Closes the connection. Before it authenticated that is a refusal, counted under `kind`
  // (empty: closed during the handshake); after, a non-empty `why` is one too (a bad request),
  // and an empty one a client that went away. Refusals go to the listener's report
  // (transport/refusal_report.h): logged with the peer's address at a bounded rate.
  void close(const std::string& why, std::string_view kind = {});
  const std::string& peer() const { return peer_; }

 private:
  // A handshake's turn: writes `mine`, then reads the client's `theirs` and goes on at `next`.
  void exchange(asio::const_buffer mine, asio::mutable_buffer theirs,
                void (Session::*next)(std::error_code));
  void onChallenge(std::error_code ec);
  void onProof(std::error_code ec);
  void readHeader();
  void readBody(uint32_t size);
  void handle(std::string_view body);
  void park(Op op, std::vector<std::string> keys, milliseconds timeout);
  void unpark();
  void releaseSlot();
  void send(std::string frame);
  void writeNext();

  ServerImpl& server_;
  asio::ip::tcp::socket socket_;
  asio::steady_timer timer_;
  asio::steady_timer auth_timer_;
  transport::Handshake handshake_;
  std::array<std::byte, transport::kChallengeBytes> challenge_{};
  std::array<std::byte, transport::kProofBytes> proof_{}, peer_proof_{};
  std::string peer_;
  bool open_ = true;
  bool slot_ = true;  // holds an accept slot until it authenticates or closes
  unsigned char header_[4] = {};
  std::string body_;
  std::deque<std::string> out_;
  // The parked GET or WAIT, if any.
  bool parked_ = false;
  uint64_t park_generation_ = 0;
  Op parked_op_ = Op::kWait;
  std::vector<std::string> parked_keys_;
  milliseconds parked_timeout_{0};
};

class ServerImpl final : public TcpStoreServer {
 public:
  ServerImpl(const std::string& host, uint16_t port, std::string secret);
  ~ServerImpl() override { stop(); }

  std::string host() const override { return host_; }
  uint16_t port() const override { return port_; }
  std::string address() const override { return fmt::format("{}:{}", host_, port_); }
  void stop() override;

  // Server thread only, from here on.
  std::unordered_map<std::string, std::string>& data() { return data_; }
  void keySet(const std::string& key);
  void watch(const std::shared_ptr<Session>& session, const std::vector<std::string>& keys);
  void unwatch(const Session* session, const std::vector<std::string>& keys);
  void forget(const Session* session);
  std::vector<std::string> missing(const std::vector<std::string>& keys) const {
    std::vector<std::string> out;
    for (const auto& key : keys) {
      if (!data_.contains(key)) out.push_back(key);
    }
    return out;
  }
  asio::io_context& io() { return io_; }
  const std::string& name() const { return name_; }
  // A session authenticated or closed: its accept slot is free.
  void releaseSlot() { gate_->release(); }
  void refused(std::string_view kind, const std::string& peer, const std::string& why) {
    gate_->refused(kind, peer, why, fmt::format("closing the connection from {}: {}", peer, why));
  }
  // stop() has begun: sessions closing now are not refused.
  bool stopping() const { return stopped_; }
  const std::string& secret() const { return secret_; }

 private:
  void accept();
  void run();

  asio::io_context io_;
  asio::ip::tcp::acceptor acceptor_{io_};
  std::unique_ptr<transport::AcceptGate> gate_;
  std::string host_;
  uint16_t port_ = 0;
  std::string name_;
  const std::string secret_;
  std::unordered_map<std::string, std::string> data_;
  std::unordered_map<std::string, std::vector<std::shared_ptr<Session>>> watchers_;
  std::unordered_map<const Session*, std::shared_ptr<Session>> sessions_;
  std::atomic<bool> stopped_{false};
  std::thread thread_;
};

Session::Session(ServerImpl& server, asio::ip::tcp::socket socket)
    : server_(server),
      socket_(std::move(socket)),
      timer_(server.io()),
      auth_timer_(server.io()),
      handshake_(server.secret(), "store", false) {
  std::error_code ec;
  const auto remote = socket_.remote_endpoint(ec);
  peer_ = ec ? std::string("an unknown peer")
             : fmt::format("{}:{}", remote.address().to_string(), remote.port());
  socket_.set_option(asio::ip::tcp::no_delay(true), ec);
}

void Session::releaseSlot() {
  if (slot_) server_.releaseSlot();
  slot_ = false;
}

void Session::start() {
  auth_timer_.expires_after(kHandshakeTimeout);
  auth_timer_.async_wait([self = shared_from_this()](std::error_code ec) {
    if (!ec && self->open_) {
      self->close(fmt::format("refused: no authentication handshake within {}",
                              detail::formatDuration(kHandshakeTimeout)),
                  transport::kRefusedNoHandshake);
    }
  });
  exchange(asio::buffer(handshake_.challenge()), asio::buffer(challenge_), &Session::onChallenge);
}

void Session::exchange(asio::const_buffer mine, asio::mutable_buffer theirs,
                       void (Session::*next)(std::error_code)) {
  asio::async_write(
      socket_, mine, [self = shared_from_this(), theirs, next](std::error_code ec, size_t) {
        if (!self->open_) return;
        if (ec) return self->close("write failed: " + ec.message());
        asio::async_read(self->socket_, theirs,
                         [self, next](std::error_code e, size_t) { ((*self).*next)(e); });
      });
}

void Session::onChallenge(std::error_code ec) {
  if (!open_) return;
  if (ec) return close(ec == asio::error::eof ? "" : "read failed: " + ec.message());
  try {
    handshake_.peerChallenge(challenge_);
  } catch (const InputError& e) {
    return close(std::string("refused: ") + e.what(), transport::kRefusedNotAPeer);
  }
  proof_ = handshake_.proof();
  exchange(asio::buffer(proof_), asio::buffer(peer_proof_), &Session::onProof);
}

void Session::onProof(std::error_code ec) {
  if (!open_) return;
  if (ec) return close(ec == asio::error::eof ? "" : "read failed: " + ec.message());
  if (!handshake_.verify(peer_proof_)) {
    return close("refused: authentication failed (the client lacks this run's secret)",
                 transport::kRefusedAuthentication);
  }
  auth_timer_.cancel();
  releaseSlot();
  readHeader();
}

void Session::readHeader() {
  asio::async_read(socket_, asio::buffer(header_),
                   [self = shared_from_this()](std::error_code ec, size_t) {
                     if (!self->open_) return;
                     if (ec) {
                       self->close(ec == asio::error::eof ? "" : "read failed: " + ec.message(),
                                   kConnectionFailed);
                       return;
                     }
                     const uint32_t size = loadU32(self->header_);
                     if (size == 0 || size > kTcpStoreMaxFrame) {
                       self->close(fmt::format("a request of {} bytes is outside 1 byte .. {} MiB",
                                               size, kTcpStoreMaxFrame >> 20));
                       return;
                     }
                     self->readBody(size);
                   });
}

void Session::readBody(uint32_t size) {
  body_.resize(size);
  asio::async_read(socket_, asio::buffer(body_),
                   [self = shared_from_this()](std::error_code ec, size_t) {
                     if (!self->open_) return;
                     if (ec) {
                       self->close("read failed: " + ec.message(), kConnectionFailed);
                       return;
                     }
                     if (self->parked_) {
                       self->close("a request arrived while another was still pending");
                       return;
                     }
                     try {
                       self->handle(self->body_);
                     } catch (const ProtocolError& e) {
                       self->close(fmt::format("malformed request: {}", e.what()));
                       return;
                     }
                     self->body_.clear();
                     if (self->open_) self->readHeader();
                   });
}

std::string okFrame() {
  auto f = startFrame();
  putU8(f, static_cast<uint8_t>(Status::kOk));
  return f;
}

std::string errorFrame(const std::string& message) {
  auto f = startFrame();
  putU8(f, static_cast<uint8_t>(Status::kError));
  putBytes(f, message);
  return finishFrame(std::move(f));
}

void Session::handle(std::string_view body) {
  Reader in(body);
  const auto op = static_cast<Op>(in.u8());
  auto& data = server_.data();
  switch (op) {
    case Op::kSet: {
      auto key = in.bytes();
      auto value = in.bytes();
      in.end();
      data[key] = std::move(value);
      send(finishFrame(okFrame()));
      server_.keySet(key);
      return;
    }
    case Op::kGet: {
      auto key = in.bytes();
      const milliseconds timeout(std::min<uint64_t>(in.u64(), kMaxTimeout.count()));
      in.end();
      if (auto it = data.find(key); it != data.end()) {
        auto f = okFrame();
        putBytes(f, it->second);
        send(finishFrame(std::move(f)));
      } else {
        park(op, {std::move(key)}, timeout);
      }
      return;
    }
    case Op::kAdd: {
      auto key = in.bytes();
      const auto delta = static_cast<int64_t>(in.u64());
      in.end();
      int64_t value = 0;
      if (auto it = data.find(key); it != data.end()) {
        try {
          value = detail::parseCounter(server_.name(), key, it->second);
        } catch (const InputError& e) {
          send(errorFrame(e.what()));
          return;
        }
      }
      if (__builtin_add_overflow(value, delta, &value)) {
        send(errorFrame(fmt::format("{}: adding {} to counter {} overflows", server_.name(), delta,
                                    detail::quoteKeys({key}))));
        return;
      }
      data[key] = std::to_string(value);
      auto f = okFrame();
      putU64(f, static_cast<uint64_t>(value));
      send(finishFrame(std::move(f)));
      server_.keySet(key);
      return;
    }
    case Op::kCheck: {
      const auto keys = in.keyList();
      in.end();
      auto f = okFrame();
      putU8(f, server_.missing(keys).empty() ? 1 : 0);
      send(finishFrame(std::move(f)));
      return;
    }
    case Op::kWait: {
      const milliseconds timeout(std::min<uint64_t>(in.u64(), kMaxTimeout.count()));
      auto keys = in.keyList();
      in.end();
      if (server_.missing(keys).empty()) {
        send(finishFrame(okFrame()));
      } else {
        park(op, std::move(keys), timeout);
      }
      return;
    }
    case Op::kRemove: {
      auto key = in.bytes();
      in.end();
      auto f = okFrame();
      putU8(f, data.erase(key) > 0 ? 1 : 0);
      send(finishFrame(std::move(f)));
      return;
    }
  }
  throw ProtocolError(fmt::format("unknown op {}", static_cast<int>(op)));
}

void Session::park(Op op, std::vector<std::string> keys, milliseconds timeout) {
  parked_ = true;
  parked_op_ = op;
  parked_keys_ = std::move(keys);
  parked_timeout_ = timeout;
  const auto generation = ++park_generation_;
  server_.watch(shared_from_this(), server_.missing(parked_keys_));
  timer_.expires_after(timeout);
  timer_.async_wait([self = shared_from_this(), generation](std::error_code ec) {
    if (ec || !self->open_ || !self->parked_ || self->park_generation_ != generation) return;
    auto f = startFrame();
    putU8(f, static_cast<uint8_t>(Status::kTimeout));
    const auto missing = self->server_.missing(self->parked_keys_);
    putU32(f, static_cast<uint32_t>(missing.size()));
    for (const auto& key : missing)
      putBytes(f, key);
    self->unpark();
    self->send(finishFrame(std::move(f)));
  });
}

void Session::unpark() {
  if (!parked_) return;
  parked_ = false;
  server_.unwatch(this, parked_keys_);
  timer_.cancel();
  parked_keys_.clear();
}

void Session::keyAppeared() {
  if (!open_ || !parked_) return;
  const auto missing = server_.missing(parked_keys_);
  if (!missing.empty()) {
    // A key may have been removed again since: watch whatever is missing now.
    server_.unwatch(this, parked_keys_);
    server_.watch(shared_from_this(), missing);
    return;
  }
  auto f = okFrame();
  if (parked_op_ == Op::kGet) putBytes(f, server_.data().at(parked_keys_.front()));
  unpark();
  send(finishFrame(std::move(f)));
}

void Session::send(std::string frame) {
  out_.push_back(std::move(frame));
  if (out_.size() == 1) writeNext();
}

void Session::writeNext() {
  asio::async_write(socket_, asio::buffer(out_.front()),
                    [self = shared_from_this()](std::error_code ec, size_t) {
                      if (!self->open_) return;
                      if (ec) {
                        self->close("write failed: " + ec.message(), kConnectionFailed);
                        return;
                      }
                      self->out_.pop_front();
                      if (!self->out_.empty()) self->writeNext();
                    });
}

void Session::close(const std::string& why, std::string_view kind) {
  if (!open_) return;
  open_ = false;
  if (server_.stopping()) {
    spdlog::debug("{}: closing the connection from {} (the server stops)", server_.name(), peer_);
  } else if (slot_) {
    server_.refused(
        kind.empty() ? transport::kRefusedClosedEarly : kind, peer_,
        why.empty() ? "closed the connection during the authentication handshake" : why);
  } else if (why.empty()) {
    spdlog::debug("{}: {} disconnected", server_.name(), peer_);
  } else {
    // Without a secret anyone may authenticate: what follows comes in numbers as well.
    server_.refused(kind.empty() ? transport::kRefusedBadRequest : kind, peer_, why);
  }
  unpark();
  releaseSlot();
  std::error_code ec;
  socket_.shutdown(asio::ip::tcp::socket::shutdown_both, ec);
  socket_.close(ec);
  server_.forget(this);
}

ServerImpl::ServerImpl(const std::string& host, uint16_t port, std::string secret)
    : host_(host), secret_(std::move(secret)) {
  try {
    asio::ip::tcp::resolver resolver(io_);
    const auto endpoints =
        resolver.resolve(host, std::to_string(port), asio::ip::tcp::resolver::passive);
    const asio::ip::tcp::endpoint endpoint = *endpoints.begin();
    acceptor_.open(endpoint.protocol());
    acceptor_.set_option(asio::ip::tcp::acceptor::reuse_address(true));
    acceptor_.bind(endpoint);
    acceptor_.listen(asio::socket_base::max_listen_connections);
    transport::setCloseOnExec(acceptor_.native_handle());
    port_ = acceptor_.local_endpoint().port();
  } catch (const std::system_error& e) {
    throw IoError(fmt::format("tcp store server: cannot listen on {}:{}: {}", host, port,
                              e.code().message()));
  }
  name_ = fmt::format("tcp store server {}:{}", host_, port_);
  gate_ = std::make_unique<transport::AcceptGate>(io_.get_executor(), name_, kMaxPendingHandshakes,
                                                  nullptr);
  accept();
  thread_ = std::thread([this] { run(); });
}

void ServerImpl::run() {
  for (;;) {
    try {
      io_.run();
      return;
    } catch (const std::exception& e) {
      spdlog::error("{}: {}", name_, e.what());
    }
  }
}

void ServerImpl::accept() {
  gate_->next([this] {
    acceptor_.async_accept([this](std::error_code ec, asio::ip::tcp::socket socket) {
      if (ec == asio::error::operation_aborted || !acceptor_.is_open()) return;
      if (ec) {
        gate_->failed(ec);  // e.g. out of descriptors: backs off, logs at a bounded rate
      } else {
        gate_->accepted();
        transport::setCloseOnExec(socket.native_handle());
        auto session = std::make_shared<Session>(*this, std::move(socket));
        sessions_.emplace(session.get(), session);
        session->start();
      }
      accept();
    });
  });
}

void ServerImpl::keySet(const std::string& key) {
  auto it = watchers_.find(key);
  if (it == watchers_.end()) return;
  auto sessions = std::move(it->second);
  watchers_.erase(it);
  for (auto& session : sessions)
    session->keyAppeared();
}

void ServerImpl::watch(const std::shared_ptr<Session>& session,
                       const std::vector<std::string>& keys) {
  for (const auto& key : keys)
    watchers_[key].push_back(session);
}

void ServerImpl::unwatch(const Session* session, const std::vector<std::string>& keys) {
  for (const auto& key : keys) {
    auto it = watchers_.find(key);
    if (it == watchers_.end()) continue;
    std::erase_if(it->second, [session](const auto& s) { return s.get() == session; });
    if (it->second.empty()) watchers_.erase(it);
  }
}

void ServerImpl::forget(const Session* session) {
  sessions_.erase(session);
}

void ServerImpl::stop() {
  if (stopped_.exchange(true)) return;
  asio::post(io_, [this] {
    std::error_code ec;
    acceptor_.close(ec);
    gate_->close();
    auto sessions = std::move(sessions_);
    for (auto& [ptr, session] : sessions)
      session->close("");
    watchers_.clear();
    io_.stop();
  });
  if (thread_.joinable()) thread_.join();
}

// ---- client ---------------------------------------------------------------------------------

milliseconds left(Clock::time_point deadline) {
  return std::max(milliseconds(0), std::chrono::ceil<milliseconds>(deadline - Clock::now()));
}

// One connection to the server; a non-blocking socket driven with poll() against deadlines.
class Connection {
 public:
  explicit Connection(int fd) : fd_(fd) {}
  ~Connection() { ::close(fd_); }
  Connection(const Connection&) = delete;
  Connection& operator=(const Connection&) = delete;
  int fd() const { return fd_; }

 private:
  int fd_;
};

class TcpStoreClient final : public Store {
 public:
  TcpStoreClient(std::string host, uint16_t port, milliseconds connect_timeout, std::string secret)
      : host_(std::move(host)),
        port_(port),
        connect_timeout_(connect_timeout),
        secret_(std::move(secret)),
        name_(fmt::format("tcp store {}:{}", host_, port_)) {}

  // Connects the first connection, retrying until the timeout.
  void connectFirst() {
    const auto deadline = Clock::now() + connect_timeout_;
    std::string last_error;
    detail::Backoff backoff(deadline);
    do {
      auto conn = tryConnect(deadline, last_error);
      if (conn) {
        idle_.push_back(std::move(conn));
        return;
      }
    } while (backoff.sleep());
    throw TimeoutError(fmt::format("timed out after {} connecting to {} (last error: {})",
                                   detail::formatDuration(connect_timeout_), name_, last_error));
  }

  void set(const std::string& key, std::string_view value) override {
    auto req = request(Op::kSet);
    putBytes(req, key);
    putBytes(req, value);
    call(std::move(req), milliseconds(0));
  }

  std::string get(const std::string& key, milliseconds timeout) override {
    auto req = request(Op::kGet);
    putBytes(req, key);
    putU64(req, static_cast<uint64_t>(clampTimeout(timeout).count()));
    return replyOf(std::move(req), timeout, [](Reader& in) { return in.bytes(); });
  }

  int64_t add(const std::string& key, int64_t delta) override {
    auto req = request(Op::kAdd);
    putBytes(req, key);
    putU64(req, static_cast<uint64_t>(delta));
    return replyOf(std::move(req), milliseconds(0),
                   [](Reader& in) { return static_cast<int64_t>(in.u64()); });
  }

  bool check(const std::vector<std::string>& keys) override {
    auto req = request(Op::kCheck);
    putKeys(req, keys);
    return replyOf(std::move(req), milliseconds(0), [](Reader& in) { return in.u8() != 0; });
  }

  void wait(const std::vector<std::string>& keys, milliseconds timeout) override {
    auto req = request(Op::kWait);
    putU64(req, static_cast<uint64_t>(clampTimeout(timeout).count()));
    putKeys(req, keys);
    Reader(call(std::move(req), timeout)).end();
  }

  bool remove(const std::string& key) override {
    auto req = request(Op::kRemove);
    putBytes(req, key);
    return replyOf(std::move(req), milliseconds(0), [](Reader& in) { return in.u8() != 0; });
  }

  std::string describe() const override { return name_; }

 private:
  // What `read` takes from the reply to `req`, which must hold that and nothing more.
  template <typename Read>
  std::invoke_result_t<const Read&, Reader&> replyOf(std::string req, milliseconds timeout,
                                                     const Read& read) {
    const auto reply = call(std::move(req), timeout);
    Reader in(reply);
    auto value = read(in);
    in.end();
    return value;
  }

  static std::string request(Op op) {
    auto f = startFrame();
    putU8(f, static_cast<uint8_t>(op));
    return f;
  }
  static void putKeys(std::string& out, const std::vector<std::string>& keys) {
    putU32(out, static_cast<uint32_t>(keys.size()));
    for (const auto& key : keys)
      putBytes(out, key);
  }

  // Sends one request and returns the OK reply's fields; the server has `timeout` to park it.
  std::string call(std::string frame, milliseconds timeout) {
    if (frame.size() - 4 > kTcpStoreMaxFrame) {
      throw InputError(fmt::format("{}: a request of {} bytes exceeds the {} MiB limit", name_,
                                   frame.size() - 4, kTcpStoreMaxFrame >> 20));
    }
    frame = finishFrame(std::move(frame));
    auto conn = acquire();
    const auto deadline = Clock::now() + clampTimeout(timeout) + kReplyGrace;
    sendAll(*conn, frame, deadline);
    unsigned char header[4];
    recvAll(*conn, header, sizeof header, deadline);
    const uint32_t size = loadU32(header);
    if (size == 0 || size > kTcpStoreMaxFrame + 64) {
      throw IoError(fmt::format("{} sent a reply of {} bytes, outside 1 byte .. {} MiB", name_,
                                size, kTcpStoreMaxFrame >> 20));
    }
    std::string body(size, '\0');
    recvAll(*conn, body.data(), size, deadline);
    release(std::move(conn));

    try {
      Reader in(body);
      const auto status = static_cast<Status>(in.u8());
      if (status == Status::kOk) return body.substr(1);
      if (status == Status::kTimeout) {
        auto missing = in.keyList();
        in.end();
        detail::throwWaitTimeout(name_, timeout, missing);
      }
      if (status == Status::kError) {
        throw InputError(fmt::format("{}: {}", name_, printable(in.bytes())));  // the server's
      }
      throw ProtocolError(fmt::format("unknown status {}", static_cast<int>(status)));
    } catch (const ProtocolError& e) {
      throw IoError(fmt::format("{} sent a malformed reply: {}", name_, e.what()));
    }
  }

  std::unique_ptr<Connection> acquire() {
    {
      std::lock_guard lock(mu_);
      if (!idle_.empty()) {
        auto conn = std::move(idle_.back());
        idle_.pop_back();
        return conn;
      }
    }
    std::string error;
    auto conn = tryConnect(Clock::now() + connect_timeout_, error);
    if (!conn) throw IoError(fmt::format("cannot connect to {}: {}", name_, error));
    return conn;
  }

  void release(std::unique_ptr<Connection> conn) {
    std::lock_guard lock(mu_);
    idle_.push_back(std::move(conn));
  }

  // One attempt over every resolved address; nullptr and `error` set on failure.
  std::unique_ptr<Connection> tryConnect(Clock::time_point deadline, std::string& error) {
    addrinfo hints{};
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    addrinfo* list = nullptr;
    const int rc = ::getaddrinfo(host_.c_str(), std::to_string(port_).c_str(), &hints, &list);
    if (rc != 0) {
      error = ::gai_strerror(rc);
      return nullptr;
    }
    std::unique_ptr<addrinfo, decltype(&::freeaddrinfo)> guard(list, &::freeaddrinfo);
    for (auto* ai = list; ai != nullptr; ai = ai->ai_next) {
      const int fd =
          ::socket(ai->ai_family, ai->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, ai->ai_protocol);
      if (fd < 0) {
        error = std::strerror(errno);
        continue;
      }
      auto conn = std::make_unique<Connection>(fd);
      if (::connect(fd, ai->ai_addr, ai->ai_addrlen) != 0) {
        if (errno != EINPROGRESS) {
          error = std::strerror(errno);
          continue;
        }
        pollfd p{fd, POLLOUT, 0};
        const int n = ::poll(&p, 1, static_cast<int>(left(deadline).count()));
        if (n <= 0) {
          error = n == 0 ? "connect timed out" : std::strerror(errno);
          continue;
        }
        int so_error = 0;
        socklen_t len = sizeof so_error;
        ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &so_error, &len);
        if (so_error != 0) {
          error = std::strerror(so_error);
          continue;
        }
      }
      const int one = 1;
      ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
      authenticate(*conn, deadline);
      return conn;
    }
    return nullptr;
  }

  // The handshake of transport/auth.h. Throws IoError at once if the server's proof is wrong or
  // it closes on ours (a wrong secret), so that a refused client does not retry until its timeout.
  void authenticate(const Connection& conn, Clock::time_point deadline) {
    transport::Handshake handshake(secret_, "store", true);
    sendAll(
        conn,
        {reinterpret_cast<const char*>(handshake.challenge().data()), handshake.challenge().size()},
        deadline);
    std::array<std::byte, transport::kChallengeBytes> challenge;
    recvAll(conn, challenge.data(), challenge.size(), deadline);
    try {
      handshake.peerChallenge(challenge);
    } catch (const InputError& e) {
      throw IoError(fmt::format("{} is not a troupe store: {}", name_, e.what()));
    }
    const auto proof = handshake.proof();
    sendAll(conn, {reinterpret_cast<const char*>(proof.data()), proof.size()}, deadline);
    std::array<std::byte, transport::kProofBytes> peer;
    recvAll(conn, peer.data(), peer.size(), deadline);
    if (!handshake.verify(peer)) {
      throw IoError(
          fmt::format("{} refused authentication: it does not share this run's secret "
                      "(TROUPE_SECRET or --secret-file)",
                      name_));
    }
  }

  void waitFor(const Connection& conn, short events, Clock::time_point deadline) {
    for (;;) {
      pollfd p{conn.fd(), events, 0};
      const auto ms = left(deadline);
      const int n = ::poll(&p, 1, static_cast<int>(std::min<int64_t>(ms.count(), 1 << 30)));
      if (n > 0) return;
      if (n == 0) {
        throw TimeoutError(fmt::format("{} sent no reply in time", name_));
      }
      if (errno != EINTR) throw IoError(fmt::format("poll on {}: {}", name_, std::strerror(errno)));
    }
  }

  void sendAll(const Connection& conn, std::string_view data, Clock::time_point deadline) {
    while (!data.empty()) {
      const ssize_t n = ::send(conn.fd(), data.data(), data.size(), MSG_NOSIGNAL);
      if (n >= 0) {
        data.remove_prefix(static_cast<size_t>(n));
      } else if (errno == EAGAIN || errno == EWOULDBLOCK) {
        waitFor(conn, POLLOUT, deadline);
      } else if (errno != EINTR) {
        throw IoError(fmt::format("lost the connection to {}: {}", name_, std::strerror(errno)));
      }
    }
  }

  void recvAll(const Connection& conn, void* buffer, size_t size, Clock::time_point deadline) {
    auto* p = static_cast<char*>(buffer);
    while (size > 0) {
      const ssize_t n = ::recv(conn.fd(), p, size, 0);
      if (n > 0) {
        p += n;
        size -= static_cast<size_t>(n);
      } else if (n == 0) {
        throw IoError(fmt::format("{} closed the connection", name_));
      } else if (errno == EAGAIN || errno == EWOULDBLOCK) {
        waitFor(conn, POLLIN, deadline);
      } else if (errno != EINTR) {
        throw IoError(fmt::format("lost the connection to {}: {}", name_, std::strerror(errno)));
      }
    }
  }

  const std::string host_;
  const uint16_t port_;
  const milliseconds connect_timeout_;
  const std::string secret_;
  const std::string name_;
  std::mutex mu_;
  std::vector<std::unique_ptr<Connection>> idle_;
};

}  // namespace

std::unique_ptr<TcpStoreServer> startTcpStoreServer(const std::string& host, uint16_t port,
                                                    const std::string& secret) {
  return std::make_unique<ServerImpl>(host, port, secret);
}

std::unique_ptr<Store> connectTcpStore(const std::string& host, uint16_t port,
                                       milliseconds connect_timeout, const std::string& secret) {
  auto client = std::make_unique<TcpStoreClient>(host, port, connect_timeout, secret);
  client->connectFirst();
  return client;
}

}  // namespace troupe::rendezvous
