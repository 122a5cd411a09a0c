// The embedded TCP store, troupe's default rendezvous: one process (the launcher, or rank 0) runs
// the server, every process connects a client to it.
//
// Every connection starts with the authentication handshake of transport/auth.h (scope "store",
// keyed by the run's secret; a client that fails it is closed before any request is read, and the
// refusal is logged with its address at a bounded rate, transport/refusal_report.h). Then the wire
// protocol (all integers little-endian): each request and each reply is one frame, a u32 body
// length followed by the body. A request body is an op byte and its fields; strings are a u32
// length and the bytes, timeouts a u64 count of milliseconds (ops numbered 1..6 in this order):
//   SET key value | GET key timeout | ADD key i64 | CHECK n key... | WAIT timeout n key...
//   REMOVE key
// A reply body is a status byte (0 OK, 1 TIMEOUT, 2 ERROR), then: OK + the op's result (GET: value,
// ADD: i64, CHECK and REMOVE: u8), TIMEOUT + n missing keys, or ERROR + message. A client has at
// most one request in flight per connection; the server parks a GET or WAIT whose keys are missing
// and answers it when they appear or its timeout runs out. Frames over 64 MiB, and anything
// malformed, close the connection.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

#include "rendezvous/store.h"

namespace troupe::rendezvous {

// Largest request or reply body either side accepts.
inline constexpr uint32_t kTcpStoreMaxFrame = 64u << 20;

// A running store server. It serves from its own thread; a client that sends a malformed or
// oversized request loses its connection (logged as its refusals are), the others go on.
class TcpStoreServer {
 public:
  // Stops the server as stop() does.
  virtual ~TcpStoreServer() = default;

  // Where it listens, e.g. "127.0.0.1" and the port it bound (the one picked when asked for 0).
  // Any thread.
  virtual std::string host() const = 0;
  virtual uint16_t port() const = 0;
  // "host:port".
  virtual std::string address() const = 0;

  // Closes the listening socket and every client connection (their pending and later calls fail
  // with IoError) and joins the server thread. Idempotent; any thread but the server's.
  virtual void stop() = 0;
};

// Binds host:port (port 0 picks a free one) and starts serving clients that know `secret` (empty:
// any client that speaks the handshake). IoError when it cannot bind.
std::unique_ptr<TcpStoreServer> startTcpStoreServer(const std::string& host, uint16_t port,
                                                    const std::string& secret = "");

// Connects to a server, retrying until `connect_timeout` runs out (TimeoutError naming
// host:port). The client opens one more connection for each call made while the others are busy,
// so a thread blocked in get() never holds up another. A server that goes away gives an IoError;
// one that sends no reply within the call's own timeout plus 30 s, a TimeoutError. A server that
// does not prove it knows `secret` (or refuses ours) gives an IoError at once.
std::unique_ptr<Store> connectTcpStore(const std::string& host, uint16_t port,
                                       std::chrono::milliseconds connect_timeout,
                                       const std::string& secret = "");

}  // namespace troupe::rendezvous
