// The embedded TCP store's server: its port, its robustness against bad clients, its shutdown.
#include <arpa/inet.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <spdlog/spdlog.h>
#include <sys/socket.h>
#include <unistd.h>

#include <array>
#include <chrono>
#include <future>
#include <sstream>
#include <string>
#include <thread>

#include <fmt/format.h>

#include "log_capture.h"
#include "redis_util.h"
#include "refusal_flood.h"
#include "rendezvous/tcp_store.h"
#include "rendezvous_util.h"
#include "transport/auth.h"
#include "troupe/error.h"

namespace troupe::rendezvous {
namespace {

using namespace testing;
using std::chrono::milliseconds;
using ::testing::HasSubstr;

// A raw TCP connection to the server, for sending bytes no client would; it passes the
// authentication handshake with `secret` first unless told not to.
class RawSocket {
 public:
  explicit RawSocket(uint16_t port, bool authenticate = true, const std::string& secret = "")
      : fd_(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0)) {
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(port);
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (::connect(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
      throw std::runtime_error("raw connect failed");
    }
    if (authenticate) handshake(secret);
  }
  // Runs the client side of the handshake; whether the server's proof was right.
  bool handshake(const std::string& secret) {
    transport::Handshake h(secret, "store", true);
    send({reinterpret_cast<const char*>(h.challenge().data()), h.challenge().size()});
    std::array<std::byte, transport::kChallengeBytes> challenge;
    if (!recvAll(challenge.data(), challenge.size())) return false;
    h.peerChallenge(challenge);
    const auto proof = h.proof();
    send({reinterpret_cast<const char*>(proof.data()), proof.size()});
    std::array<std::byte, transport::kProofBytes> theirs;
    return recvAll(theirs.data(), theirs.size()) && h.verify(theirs);
  }
  bool recvAll(void* into, size_t n) const {
    auto* p = static_cast<char*>(into);
    while (n > 0) {
      const ssize_t got = ::recv(fd_, p, n, 0);
      if (got <= 0) return false;
      p += got;
      n -= static_cast<size_t>(got);
    }
    return true;
  }
  ~RawSocket() { ::close(fd_); }
  void send(std::string_view bytes) const {
    ASSERT_EQ(::send(fd_, bytes.data(), bytes.size(), MSG_NOSIGNAL),
              static_cast<ssize_t>(bytes.size()));
  }
  // "127.0.0.1:port" of this end, as the server sees it.
  std::string localAddress() const {
    sockaddr_in addr{};
    socklen_t len = sizeof addr;
    ::getsockname(fd_, reinterpret_cast<sockaddr*>(&addr), &len);
    return fmt::format("127.0.0.1:{}", ntohs(addr.sin_port));
  }
  // True when the server closes the connection within `within`.
  bool closedWithin(milliseconds within) const {
    const auto deadline = Clock::now() + within;
    char buffer[256];
    while (Clock::now() < deadline) {
      pollfd p{fd_, POLLIN, 0};
      if (::poll(&p, 1, 20) <= 0) continue;
      const ssize_t n = ::recv(fd_, buffer, sizeof buffer, 0);
      if (n <= 0) return true;
    }
    return false;
  }

 private:
  int fd_;
};

using testing::LogCapture;

std::string frame(std::string_view body) {
  std::string f(4, '\0');
  const auto n = static_cast<uint32_t>(body.size());
  for (int i = 0; i < 4; ++i)
    f[i] = static_cast<char>((n >> (8 * i)) & 0xff);
  return f + std::string(body);
}

TEST(TcpStoreServerTest, PicksAFreePortWhenAskedForZero) {
  auto server = startTcpStoreServer("127.0.0.1", 0);
  EXPECT_NE(server->port(), 0);
  EXPECT_EQ(server->host(), "127.0.0.1");
  EXPECT_EQ(server->address(), fmt::format("127.0.0.1:{}", server->port()));
  auto store = connectTcpStore("127.0.0.1", server->port(), kLong);
  EXPECT_EQ(store->describe(), fmt::format("tcp store 127.0.0.1:{}", server->port()));
}

TEST(TcpStoreServerTest, BindingAPortInUseFailsNamingIt) {
  auto server = startTcpStoreServer("127.0.0.1", 0);
  try {
    startTcpStoreServer("127.0.0.1", server->port());
    FAIL() << "a second server bound the same port";
  } catch (const IoError& e) {
    EXPECT_THAT(e.what(), HasSubstr(fmt::format("127.0.0.1:{}", server->port())));
  }
}

TEST(TcpStoreServerTest, ClientSendingGarbageIsDisconnectedWhileOthersKeepWorking) {
  LogCapture log;
  auto server = startTcpStoreServer("127.0.0.1", 0);
  auto good = connectTcpStore("127.0.0.1", server->port(), kLong);
  auto waiter = connectTcpStore("127.0.0.1", server->port(), kLong);
  auto parked = std::async(std::launch::async, [&] { return waiter->get("after", kLong); });
  good->set("before", "1");

  RawSocket oversized(server->port());
  oversized.send("GARBAGE BYTES, NOT A FRAME");  // "GARB" reads as a 1.1 GB length
  EXPECT_TRUE(oversized.closedWithin(kLong));

  RawSocket unknown_op(server->port());
  unknown_op.send(frame("\x63 what"));
  EXPECT_TRUE(unknown_op.closedWithin(kLong));

  RawSocket truncated(server->port());
  truncated.send(frame(std::string("\x01\xff\xff\x00\x00", 5)));  // SET with a key overrunning
  EXPECT_TRUE(truncated.closedWithin(kLong));

  RawSocket empty(server->port());
  empty.send(std::string(4, '\0'));
  EXPECT_TRUE(empty.closedWithin(kLong));

  {
    RawSocket half(server->port());  // half a frame, then gone
    half.send(std::string("\x10\x00\x00\x00\x01", 5));
  }

  RawSocket unauthenticated(server->port(), false);  // a frame where the handshake should be
  unauthenticated.send(frame(std::string("\x01\x01\x00\x00\x00k\x32\x00\x00\x00", 10) +
                             std::string(50, 'v')));  // SET k, as long as a challenge
  EXPECT_TRUE(unauthenticated.closedWithin(kLong));

  EXPECT_EQ(good->get("before", kShort), "1");
  good->set("after", "2");
  EXPECT_EQ(parked.get(), "2");
  EXPECT_EQ(good->add("n", 3), 3);

  const auto logged = log.text();
  EXPECT_THAT(logged, HasSubstr(oversized.localAddress()));
  EXPECT_THAT(logged, HasSubstr(unknown_op.localAddress()));
  EXPECT_THAT(logged, HasSubstr(truncated.localAddress()));
  EXPECT_THAT(logged, HasSubstr("64 MiB"));
  EXPECT_THAT(logged, HasSubstr("unknown op 99"));
  EXPECT_THAT(logged, HasSubstr(unauthenticated.localAddress() + ": refused: not a troupe peer"));
  EXPECT_FALSE(good->check({"k"})) << "the unauthenticated SET was read";
}

TEST(TcpStoreServerTest, AClientWithoutTheRunsSecretCannotReadOrWrite) {
  LogCapture log;
  auto server = startTcpStoreServer("127.0.0.1", 0, "run-secret");
  auto member = connectTcpStore("127.0.0.1", server->port(), kLong, "run-secret");
  member->set("weights-at", "tcp://10.0.0.1:7000");
  for (const std::string secret : {"a-guess", ""}) {
    SCOPED_TRACE("secret '" + secret + "'");
    const auto start = Clock::now();
    try {
      connectTcpStore("127.0.0.1", server->port(), kLong, secret);
      FAIL() << "connected without the secret";
    } catch (const IoError& e) {
      EXPECT_THAT(e.what(), HasSubstr("refused authentication"));
    }
    EXPECT_LT(Clock::now() - start, kLong) << "a refused client retried until its timeout";
  }
  // A rogue that ignores the failed handshake and writes anyway is never read.
  RawSocket rogue(server->port(), false);
  EXPECT_FALSE(rogue.handshake("a-guess"));
  rogue.send(frame(std::string("\x01\x0a\x00\x00\x00weights-at\x01\x00\x00\x00x", 20)));
  EXPECT_TRUE(rogue.closedWithin(kLong));
  EXPECT_EQ(member->get("weights-at", kShort), "tcp://10.0.0.1:7000");
  EXPECT_THAT(log.text(), HasSubstr(rogue.localAddress() + ": refused: authentication failed"));
}

TEST(TcpStoreServerTest, ClientOfAStoppedServerGetsAnErrorInsteadOfHanging) {
  auto server = startTcpStoreServer("127.0.0.1", 0);
  auto store = connectTcpStore("127.0.0.1", server->port(), kShort);
  store->set("k", "v");
  auto blocked = std::async(std::launch::async, [&] { return store->get("never", kLong); });
  std::this_thread::sleep_for(milliseconds(100));
  const auto stopped_at = Clock::now();
  server->stop();
  EXPECT_THROW(blocked.get(), IoError);
  EXPECT_LT(Clock::now() - stopped_at, milliseconds(1000));
  // Later calls fail too, on the pooled connection or on a refused new one.
  EXPECT_THROW(store->set("k", "v2"), IoError);
  EXPECT_THROW(store->get("k", kShort), IoError);
  server->stop();  // idempotent
}

TEST(TcpStoreServerTest, ConnectTimesOutNamingHostAndPort) {
  const uint16_t port = testing::freeLoopbackPort();
  const auto start = Clock::now();
  try {
    connectTcpStore("127.0.0.1", port, kShort);
    FAIL() << "connected to nothing";
  } catch (const TimeoutError& e) {
    EXPECT_THAT(e.what(), HasSubstr(fmt::format("127.0.0.1:{}", port)));
    EXPECT_THAT(e.what(), HasSubstr("250 ms"));
  }
  EXPECT_GE(Clock::now() - start, kShort);
  EXPECT_LT(Clock::now() - start, kShort + milliseconds(1000));
}

TEST(TcpStoreServerTest, ConnectRetriesUntilTheServerComesUp) {
  const uint16_t port = testing::freeLoopbackPort();
  auto late = std::async(std::launch::async, [port] {
    std::this_thread::sleep_for(milliseconds(150));
    return startTcpStoreServer("127.0.0.1", port);
  });
  auto store = connectTcpStore("127.0.0.1", port, kLong);
  auto server = late.get();
  store->set("k", "v");
  EXPECT_EQ(store->get("k", kShort), "v");
}

TEST(TcpStoreServerTest, ServesManyParkedClientsAtOnce) {
  auto server = startTcpStoreServer("127.0.0.1", 0);
  auto store = connectTcpStore("127.0.0.1", server->port(), kLong);
  // One client, many threads: each blocked call gets its own connection.
  std::vector<std::future<void>> waiters;
  for (int i = 0; i < 16; ++i) {
    waiters.push_back(std::async(std::launch::async, [&] { store->wait({"go", "set"}, kLong); }));
  }
  std::this_thread::sleep_for(milliseconds(50));
  store->set("go", "");
  EXPECT_EQ(store->add("set", 1), 1);
  for (auto& w : waiters)
    EXPECT_NO_THROW(w.get());
}

TEST(TcpStoreServerTest, AValueOverTheFrameLimitIsRejectedByTheClient) {
  auto server = startTcpStoreServer("127.0.0.1", 0);
  auto store = connectTcpStore("127.0.0.1", server->port(), kLong);
  EXPECT_THROW(store->set("huge", std::string(kTcpStoreMaxFrame, 'x')), InputError);
  store->set("small", "ok");
  EXPECT_EQ(store->get("small", kShort), "ok");
}

TEST(TcpStoreServerTest, NeitherItsListeningSocketNorItsClientsLeakIntoStartedProcesses) {
  // The launcher serves the store and then starts the run's processes: they must not inherit it.
  auto server = startTcpStoreServer("127.0.0.1", 0);
  auto store = connectTcpStore("127.0.0.1", server->port(), kLong);
  store->set("k", "v");  // a session is open on the server's side too
  FILE* child = ::popen("for f in /proc/$$/fd/*; do readlink \"$f\"; done; true", "r");
  ASSERT_NE(child, nullptr);
  std::string links;
  for (char buffer[256]; std::fgets(buffer, sizeof buffer, child);)
    links += buffer;
  ASSERT_EQ(::pclose(child), 0);
  EXPECT_THAT(links, ::testing::Not(HasSubstr("socket:"))) << links;
}

TEST(TcpStoreServerTest, SilentStrangersAreCutOffAfterAFewSecondsAndCannotCrowdOutClients) {
  LogCapture log;
  auto server = startTcpStoreServer("127.0.0.1", 0);
  std::vector<std::unique_ptr<RawSocket>> strangers;
  for (int i = 0; i < 100; ++i)
    strangers.push_back(std::make_unique<RawSocket>(server->port(), false));
  // 64 hold the slots, 36 wait in the backlog behind them, and so does the client: it gets in
  // when the first 64 are cut off after the 5 s handshake deadline (before: 30 s).
  const auto begin = Clock::now();
  auto store = connectTcpStore("127.0.0.1", server->port(), milliseconds(15000));
  store->set("k", "v");
  EXPECT_EQ(store->get("k", kShort), "v");
  EXPECT_LT(Clock::now() - begin, milliseconds(12000));
  EXPECT_THAT(log.text(), HasSubstr("no authentication handshake within 5 s"));
  EXPECT_THAT(log.text(), HasSubstr("have not authenticated yet; accepting pauses"));
}

TEST(TcpStoreServerTest, AFloodOfStrangersIsCountedInFullButLoggedAtABoundedRate) {
  LogCapture log;
  const auto begin = Clock::now();
  auto server = startTcpStoreServer("127.0.0.1", 0);
  constexpr int kStrangers = 2000;
  ASSERT_EQ(testing::floodWithGarbage(server->port(), kStrangers), kStrangers);
  auto store = connectTcpStore("127.0.0.1", server->port(), kLong);
  store->set("k", "v");  // the run's own clients are served all along
  EXPECT_EQ(store->get("k", kShort), "v");
  server->stop();  // logs the summary still pending
  const double seconds = std::chrono::duration<double>(Clock::now() - begin).count();

  const auto refusals =
      testing::countRefusals(testing::splitLines(log.text()), ": refused: not a troupe peer");
  EXPECT_EQ(refusals.connections, static_cast<std::uint64_t>(kStrangers)) << log.text();
  // The report's default limits: 10 lines one by one, then one a token, a token every 5 s, and
  // the summary at the end (before: one line per connection).
  EXPECT_LE(refusals.lines, 10 + static_cast<std::size_t>(seconds / 5) + 1) << log.text();
  ASSERT_FALSE(refusals.summaries.empty()) << log.text();
  EXPECT_THAT(refusals.summaries.back(),
              ::testing::ContainsRegex("\\([0-9]+ not a troupe peer\\); the last from "
                                       "127\\.0\\.0\\.1:[0-9]+: refused: not a troupe peer"));
}

}  // namespace
}  // namespace troupe::rendezvous
