// Transports in one process over real loopback sockets (TCP and Unix).
#include <arpa/inet.h>
#include <capnp/any.h>
#include <capnp/message.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <spdlog/sinks/base_sink.h>
#include <spdlog/spdlog.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <asio.hpp>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <filesystem>
#include <mutex>
#include <thread>

#include "refusal_flood.h"
#include "transport/auth.h"
#include "transport/frame.h"
#include "transport/link.h"
#include "transport/shared_arena.h"
#include "troupe/error.h"

namespace troupe::transport {
namespace {

using namespace std::chrono_literals;
using kernels::Tensor;

class CaptureSink final : public spdlog::sinks::base_sink<std::mutex> {
 public:
  std::vector<std::string> errors() {
    std::lock_guard lock(mutex_);
    return errors_;
  }
  // Lines of any level that contain `text`.
  std::size_t countLines(const std::string& text) {
    std::lock_guard lock(mutex_);
    return static_cast<std::size_t>(
        std::count_if(lines_.begin(), lines_.end(),
                      [&](const std::string& l) { return l.find(text) != std::string::npos; }));
  }

 protected:
  void sink_it_(const spdlog::details::log_msg& msg) override {
    if (msg.level >= spdlog::level::err)
      errors_.emplace_back(msg.payload.data(), msg.payload.size());
    lines_.emplace_back(msg.payload.data(), msg.payload.size());
  }
  void flush_() override {}

 private:
  std::vector<std::string> errors_;
  std::vector<std::string> lines_;
};

// One transport with an inbox.
struct Peer {
  std::mutex mutex;
  std::condition_variable changed;
  std::vector<std::pair<NodeId, IncomingMessage>> messages;
  std::vector<std::pair<NodeId, std::string>> lost;
  std::shared_ptr<CaptureSink> sink = std::make_shared<CaptureSink>();
  std::function<void(NodeId, IncomingMessage&)> hook;  // runs on the transport thread, if set
  bool keep = true;                                    // store messages (else count them only)
  std::size_t total = 0;
  std::unique_ptr<Transport> transport;

  explicit Peer(TransportOptions options) {
    options.logger = std::make_shared<spdlog::logger>("node" + std::to_string(options.node), sink);
    transport = makeTransport(options, {[this](NodeId node, IncomingMessage message) {
                                          if (hook) hook(node, message);
                                          std::lock_guard lock(mutex);
                                          ++total;
                                          if (keep) messages.emplace_back(node, std::move(message));
                                          changed.notify_all();
                                        },
                                        [this](NodeId node, const std::string& why) {
                                          std::lock_guard lock(mutex);
                                          lost.emplace_back(node, why);
                                          changed.notify_all();
                                        }});
  }
  bool waitMessages(std::size_t n, std::chrono::milliseconds timeout = 10s) {
    std::unique_lock lock(mutex);
    return changed.wait_for(lock, timeout, [&] { return total >= n; });
  }
  bool waitLost(std::size_t n, std::chrono::milliseconds timeout = 10s) {
    std::unique_lock lock(mutex);
    return changed.wait_for(lock, timeout, [&] { return lost.size() >= n; });
  }
  std::size_t lostCount() {
    std::lock_guard lock(mutex);
    return lost.size();
  }
  // The node first reported lost (under the lock: the transport's thread may report more).
  NodeId firstLost() {
    std::lock_guard lock(mutex);
    return lost.empty() ? NodeId(-1) : lost[0].first;
  }
  std::size_t count() {
    std::lock_guard lock(mutex);
    return total;
  }
  bool linkAddressless(NodeId node) { return transport->linkAddress(node).empty(); }
  // The errors logged so far, once there are more than `seen` (or after `timeout`).
  std::vector<std::string> errorsAfter(std::size_t seen, std::chrono::milliseconds timeout = 2s) {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    auto errors = sink->errors();
    while (errors.size() <= seen && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(10ms);
      errors = sink->errors();
    }
    return errors;
  }
  IncomingMessage message(std::size_t i) {
    std::lock_guard lock(mutex);
    return messages.at(i).second;
  }
};

class TransportTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           ("troupe-transport-" + std::to_string(getpid()) + "-" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
  }
  void TearDown() override {
    std::error_code ignored;
    std::filesystem::remove_all(dir_, ignored);
  }
  TransportOptions options(NodeId node, bool unixSocket) const {
    TransportOptions o;
    o.node = node;
    o.runId = "test-run";
    o.interface = "lo";
    o.unixSocket = unixSocket;
    o.connectTimeout = 5s;
    return o;
  }
  std::filesystem::path dir_;
};

Tensor iota(std::int64_t n, float start = 0) {
  Tensor t = Tensor::host({n});
  for (std::int64_t i = 0; i < n; ++i)
    t.f32()[i] = start + static_cast<float>(i);
  return t;
}

std::uint64_t checksum(const void* data, std::size_t bytes) {
  std::uint64_t h = 1469598103934665603ull;
  const auto* p = static_cast<const std::uint64_t*>(data);
  for (std::size_t i = 0; i < bytes / 8; ++i)
    h = (h ^ p[i]) * 1099511628211ull;
  return h;
}

std::vector<std::byte> garbageBytes(std::size_t n) {
  std::vector<std::byte> out(n);
  for (std::size_t i = 0; i < n; ++i)
    out[i] = static_cast<std::byte>((i * 131 + 7) & 0xff);
  return out;
}

bool inside(const void* p, std::span<const std::byte> buffer) {
  const auto* b = static_cast<const std::byte*>(p);
  return b >= buffer.data() && b < buffer.data() + buffer.size();
}

OutgoingMessage gradBucket(std::int64_t step, const Tensor& grads) {
  OutgoingMessage m;
  auto frame = m.frame();
  frame.setTarget(3);
  frame.setSourceNode(0);
  frame.setSourceActor(1);
  auto bucket = frame.initGradBucket();
  bucket.setStep(step);
  bucket.setReplica(2);
  bucket.setBegin(10);
  bucket.setEnd(10 + grads.numel());
  m.setTensor(bucket.initGrads(), grads);
  return m;
}

OutgoingMessage stepDone(std::int64_t step, int replica) {
  OutgoingMessage m;
  auto done = m.frame().initStepDone();
  done.setStep(step);
  done.setReplica(replica);
  done.setLossSum(0.5 * static_cast<double>(step));
  return m;
}

void connectPair(Peer& a, Peer& b) {
  a.transport->connect(b.transport->node(), b.transport->address());
  b.transport->waitForPeer(a.transport->node(), 5s);
}

// Both directions work between a and b.
void expectExchange(Peer& a, Peer& b) {
  const std::size_t seenA = a.count(), seenB = b.count();
  a.transport->send(b.transport->node(), stepDone(41, 0));
  b.transport->send(a.transport->node(), stepDone(42, 1));
  ASSERT_TRUE(b.waitMessages(seenB + 1));
  ASSERT_TRUE(a.waitMessages(seenA + 1));
  EXPECT_EQ(b.message(seenB).frame().getStepDone().getStep(), 41);
  EXPECT_EQ(a.message(seenA).frame().getStepDone().getStep(), 42);
}

// ---- interfaces ----

TEST(ResolveInterface, LoopbackIs127001) {
  EXPECT_EQ(resolveInterface("lo"), "127.0.0.1");
}

TEST(ResolveInterface, AnUnknownNameFailsListingTheInterfaces) {
  try {
    resolveInterface("no-such-nic0");
    FAIL() << "no error";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("no-such-nic0"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("lo"), std::string::npos) << e.what();
  }
}

// ---- exchange ----

TEST_F(TransportTest, TwoNodesExchangeMessagesOverTcp) {
  Peer a(options(0, false)), b(options(1, false));
  EXPECT_EQ(a.transport->address().rfind("tcp://127.0.0.1:", 0), 0u) << a.transport->address();
  connectPair(a, b);
  EXPECT_EQ(a.transport->linkAddress(1).rfind("tcp://", 0), 0u);
  a.transport->send(1, gradBucket(7, iota(1000, 0.5f)));
  ASSERT_TRUE(b.waitMessages(1));
  auto message = b.message(0);
  EXPECT_EQ(b.messages[0].first, 0u);
  auto frame = message.frame();
  ASSERT_TRUE(frame.isGradBucket());
  EXPECT_EQ(frame.getTarget(), 3u);
  EXPECT_EQ(frame.getSourceActor(), 1u);
  auto bucket = frame.getGradBucket();
  EXPECT_EQ(bucket.getStep(), 7);
  EXPECT_EQ(bucket.getReplica(), 2);
  EXPECT_EQ(bucket.getEnd(), 1010);
  Tensor grads = message.tensor(bucket.getGrads());
  ASSERT_EQ(grads.numel(), 1000);
  for (int i = 0; i < 1000; ++i)
    ASSERT_EQ(grads.f32()[i], 0.5f + static_cast<float>(i));
  expectExchange(a, b);
}

TEST_F(TransportTest, ThreeNodesExchangeMessagesOverUnixSockets) {
  Peer a(options(0, true)), b(options(1, true)), c(options(2, true));
  EXPECT_NE(b.transport->address().find(";unix://"), std::string::npos) << b.transport->address();
  connectPair(a, b);
  connectPair(a, c);
  connectPair(b, c);
  for (auto [from, to] :
       std::initializer_list<std::pair<Peer*, Peer*>>{{&a, &b}, {&a, &c}, {&b, &c}}) {
    EXPECT_EQ(from->transport->linkAddress(to->transport->node()).rfind("unix://", 0), 0u);
    expectExchange(*from, *to);
  }
  // A tensor over a Unix socket.
  c.transport->send(0, gradBucket(1, iota(5000)));
  ASSERT_TRUE(a.waitMessages(3));
  Tensor grads = a.message(2).tensor(a.message(2).frame().getGradBucket().getGrads());
  EXPECT_EQ(grads.f32()[4999], 4999.0f);
}

TEST_F(TransportTest, MessagesToOneNodeArriveInSendOrderUnderLoad) {
  Peer a(options(0, false)), b(options(1, false));
  connectPair(a, b);
  constexpr int kPerThread = 5000;
  std::vector<std::thread> senders;
  for (int t = 0; t < 2; ++t) {
    senders.emplace_back([&, t] {
      for (int i = 0; i < kPerThread; ++i)
        a.transport->send(1, stepDone(i, t));
    });
  }
  for (auto& s : senders)
    s.join();
  ASSERT_TRUE(b.waitMessages(2 * kPerThread, 20s));
  std::int64_t next[2] = {0, 0};
  for (auto& [node, message] : b.messages) {
    auto done = message.frame().getStepDone();
    ASSERT_EQ(done.getStep(), next[done.getReplica()]++) << "replica " << done.getReplica();
  }
  EXPECT_EQ(next[0], kPerThread);
  EXPECT_EQ(next[1], kPerThread);
}

// A sender writes on its own thread what the socket takes at once and leaves the rest to the io
// thread: messages far larger than the socket's buffer, from two threads at once, over TCP and
// Unix sockets, arrive whole and in each thread's order (a partly written message finishes
// before the next one starts).
TEST_F(TransportTest, MessagesLargerThanTheSocketBufferFromTwoThreadsArriveWholeAndInOrder) {
  for (const bool unix_socket : {false, true}) {
    Peer a(options(0, unix_socket)), b(options(1, unix_socket));
    connectPair(a, b);
    constexpr int kPerThread = 40;
    constexpr std::int64_t kFloats = 300 * 1024;  // 1.2 MB each, inline in the frame
    std::vector<std::thread> senders;
    for (int t = 0; t < 2; ++t) {
      senders.emplace_back([&, t] {
        for (int i = 0; i < kPerThread; ++i)
          a.transport->send(1, gradBucket(t * kPerThread + i, iota(kFloats, 1000.0f * i + t)));
      });
    }
    for (auto& s : senders)
      s.join();
    ASSERT_TRUE(b.waitMessages(2 * kPerThread, 60s)) << (unix_socket ? "unix" : "tcp");
    int next[2] = {0, 0};
    for (std::size_t m = 0; m < b.messages.size(); ++m) {
      auto message = b.message(m);
      const auto bucket = message.frame().getGradBucket();
      const int t = static_cast<int>(bucket.getStep() / kPerThread);
      const int i = static_cast<int>(bucket.getStep() % kPerThread);
      ASSERT_EQ(i, next[t]++) << "thread " << t << (unix_socket ? ", unix" : ", tcp");
      const Tensor got = message.tensor(bucket.getGrads());
      const Tensor want = iota(kFloats, 1000.0f * i + t);
      ASSERT_EQ(got.numel(), kFloats);
      ASSERT_EQ(checksum(got.raw(), got.bytes()), checksum(want.raw(), want.bytes()))
          << "message " << i << " of thread " << t << (unix_socket ? ", unix" : ", tcp");
    }
  }
}

// Several TCP connections a pair (connectionsPerPeer): the dialing node opens them all; messages
// with a lane spread over them and all arrive, messages without one keep their send order.
TEST_F(TransportTest, ExtraTcpConnectionsCarryLanedMessagesWhileOrderedOnesKeepTheirOrder) {
  TransportOptions oa = options(0, false), ob = options(1, false);
  oa.connectionsPerPeer = ob.connectionsPerPeer = 3;
  Peer a(oa), b(ob);
  connectPair(a, b);
  EXPECT_EQ(a.transport->connections(1), 3);
  for (int i = 0; i < 500 && b.transport->connections(0) < 3; ++i)
    std::this_thread::sleep_for(10ms);
  EXPECT_EQ(b.transport->connections(0), 3) << "the accepting side sees every connection";
  constexpr int kEach = 400;
  for (Peer* from : {&a, &b}) {
    Peer* to = from == &a ? &b : &a;
    const std::size_t seen = to->count();
    for (int i = 0; i < kEach; ++i) {
      from->transport->send(to->transport->node(), stepDone(i, 0));  // ordered
      auto laned = stepDone(i, 1);
      laned.setLane(i);
      from->transport->send(to->transport->node(), std::move(laned));
    }
    ASSERT_TRUE(to->waitMessages(seen + 2 * kEach, 20s));
    std::int64_t next = 0;
    std::vector<bool> got(kEach, false);
    std::lock_guard lock(to->mutex);
    for (std::size_t m = seen; m < to->messages.size(); ++m) {
      auto done = to->messages[m].second.frame().getStepDone();
      if (done.getReplica() == 0) {
        ASSERT_EQ(done.getStep(), next++) << "an ordered message overtook another";
      } else {
        got.at(static_cast<std::size_t>(done.getStep())) = true;
      }
    }
    EXPECT_EQ(next, kEach);
    EXPECT_EQ(std::count(got.begin(), got.end(), true), kEach) << "laned messages lost";
  }
}

TEST_F(TransportTest, APeerWithExtraConnectionsThatShutsDownIsReportedLostAndLeavesNone) {
  TransportOptions oa = options(0, false), ob = options(1, false);
  oa.connectionsPerPeer = ob.connectionsPerPeer = 2;
  Peer a(oa);
  auto b = std::make_unique<Peer>(ob);
  connectPair(*b, a);
  ASSERT_EQ(b->transport->connections(0), 2);
  b.reset();
  ASSERT_TRUE(a.waitLost(1));
  for (int i = 0; i < 500 && a.transport->connections(1) > 0; ++i)
    std::this_thread::sleep_for(10ms);
  EXPECT_EQ(a.transport->connections(1), 0);
  EXPECT_THROW(a.transport->send(1, stepDone(1, 0)), IoError);
  // Reported once, though each of its connections closed.
  std::this_thread::sleep_for(50ms);
  std::lock_guard lock(a.mutex);
  ASSERT_EQ(a.lost.size(), 1u);
  EXPECT_EQ(a.lost[0].first, 1u);
}

// ---- tensors: zero copy and bulk chunks ----

TEST_F(TransportTest, AOneMegabyteTensorArrivesAsAViewIntoTheReceiveBuffer) {
  Peer a(options(0, false)), b(options(1, false));
  connectPair(a, b);
  Tensor sent = iota(256 * 1024);
  a.transport->send(1, gradBucket(1, sent));
  ASSERT_TRUE(b.waitMessages(1));
  auto message = b.message(0);
  Tensor got = message.tensor(message.frame().getGradBucket().getGrads());
  ASSERT_EQ(got.numel(), sent.numel());
  EXPECT_TRUE(inside(got.raw(), message.frameBuffer())) << "copied out of the frame buffer";
  EXPECT_TRUE(message.bulkBuffer().empty());
  EXPECT_EQ(checksum(got.raw(), got.bytes()), checksum(sent.raw(), sent.bytes()));
}

TEST_F(TransportTest, AMisalignedSliceTravelsIntactWithoutACopy) {
  Peer a(options(0, false)), b(options(1, false));
  connectPair(a, b);
  Tensor whole = iota(4001);
  a.transport->send(1, gradBucket(1, whole.slice(1, 4001)));
  ASSERT_TRUE(b.waitMessages(1));
  auto message = b.message(0);
  Tensor got = message.tensor(message.frame().getGradBucket().getGrads(), {40, 100});
  EXPECT_EQ(got.shape(), (kernels::Shape{40, 100}));
  EXPECT_TRUE(inside(got.raw(), message.frameBuffer()));
  for (int i = 0; i < 4000; ++i)
    ASSERT_EQ(got.f32()[i], static_cast<float>(i + 1));
}

TEST_F(TransportTest, AHundredMegabyteTensorRoundTripsThroughBulkChunks) {
  Peer a(options(0, false)), b(options(1, false));
  connectPair(a, b);
  constexpr std::int64_t kFloats = 25'000'000;  // 100 MB, over the 64 MiB frame limit
  Tensor sent = Tensor::host({kFloats});
  auto* bits = reinterpret_cast<std::uint32_t*>(sent.raw());
  for (std::int64_t i = 0; i < kFloats; ++i)
    bits[i] = static_cast<std::uint32_t>(i * 2654435761u);
  const auto sum = checksum(sent.raw(), sent.bytes());
  // b sends back what it got: the view into its bulk buffer goes out without a copy too.
  b.hook = [&](NodeId from, IncomingMessage& message) {
    OutgoingMessage reply;
    auto weights = reply.frame().initWeights();
    weights.setStep(2);
    reply.setTensor(weights.initWeights(),
                    message.tensor(message.frame().getWeights().getWeights()));
    b.transport->send(from, std::move(reply));
  };
  OutgoingMessage m;
  auto weights = m.frame().initWeights();
  weights.setStep(1);
  m.setTensor(weights.initWeights(), sent);
  m.setTensor(weights.initBuffers(), iota(10));
  a.transport->send(1, std::move(m));
  ASSERT_TRUE(b.waitMessages(1, 20s));
  auto there = b.message(0);
  ASSERT_EQ(there.frame().getBulk().size(), 1u);
  Tensor viewed = there.tensor(there.frame().getWeights().getWeights());
  EXPECT_TRUE(inside(viewed.raw(), there.bulkBuffer()));
  EXPECT_EQ(there.tensor(there.frame().getWeights().getBuffers()).f32()[9], 9.0f);
  ASSERT_TRUE(a.waitMessages(1, 20s));
  auto back = a.message(0);
  Tensor got = back.tensor(back.frame().getWeights().getWeights());
  ASSERT_EQ(got.numel(), kFloats);
  EXPECT_EQ(checksum(got.raw(), got.bytes()), sum);
  EXPECT_TRUE(a.sink->errors().empty());
  EXPECT_TRUE(b.sink->errors().empty());
}

TEST_F(TransportTest, TensorsTooLargeTogetherForOneFrameGoAsBulk) {
  TransportOptions small = options(0, false);
  small.maxFrameBytes = 64 * 1024;
  small.bulkChunkBytes = 10000;  // not a multiple of 8: chunks at odd offsets
  Peer a(small), b(options(1, false));
  connectPair(a, b);
  OutgoingMessage m;
  auto epoch = m.frame().initEpochEnd();
  m.setTensor(epoch.initWeights(), iota(12000, 1));  // 48 KB: fits a 64 KiB frame alone ...
  m.setTensor(epoch.initState(), iota(9000, 2));     // ... but not with this one
  a.transport->send(1, std::move(m));
  OutgoingMessage big;
  big.setTensor(big.frame().initEpochEnd().initWeights(), iota(100000, 3));  // over the limit
  a.transport->send(1, std::move(big));
  ASSERT_TRUE(b.waitMessages(2));
  auto message = b.message(0);
  auto got = message.frame().getEpochEnd();
  EXPECT_EQ(message.frame().getBulk().size(), 1u);
  Tensor weights = message.tensor(got.getWeights());
  Tensor momentum = message.tensor(got.getState());
  EXPECT_TRUE(inside(weights.raw(), message.frameBuffer()));
  EXPECT_TRUE(inside(momentum.raw(), message.bulkBuffer()));
  EXPECT_EQ(weights.f32()[11999], 12000.0f);
  EXPECT_EQ(momentum.f32()[8999], 9001.0f);
  auto second = b.message(1);
  Tensor large = second.tensor(second.frame().getEpochEnd().getWeights());
  ASSERT_EQ(large.numel(), 100000);
  for (int i = 0; i < 100000; ++i)
    ASSERT_EQ(large.f32()[i], 3.0f + static_cast<float>(i));
}

// ---- shared memory between processes of one host ----

TEST(SharedArena, ReusesABlockOnceTheSenderAndEveryReceiverDroppedIt) {
  std::string why;
  auto arena = SharedArena::create(1 << 20, &why);
  ASSERT_TRUE(arena) << why;
  auto peer = PeerArena::open(arena->path(), arena->token(), arena->bytes());
  constexpr std::size_t kBlock = 300 * 1024;
  auto first = arena->allocate(kBlock);
  auto second = arena->allocate(kBlock);
  auto third = arena->allocate(kBlock);
  ASSERT_TRUE(first && second && third);
  EXPECT_FALSE(arena->allocate(kBlock)) << "a 1 MiB arena holds three 300 KiB blocks, not four";
  std::memset(first.get(), 0x5a, kBlock);
  const auto offset = arena->share(first.get(), kBlock);
  ASSERT_TRUE(offset);
  EXPECT_FALSE(arena->share(first.get() + 64, 1000)) << "only a block's start can be shared";
  auto seen = peer->take(*offset, kBlock);
  EXPECT_EQ(seen.get()[kBlock - 1], std::byte{0x5a});
  first.reset();  // the receiver still holds the first block: nothing to reuse yet
  EXPECT_FALSE(arena->allocate(kBlock));
  EXPECT_EQ(arena->liveBlocks(), 3u);
  seen.reset();
  EXPECT_EQ(arena->liveBlocks(), 2u);
  auto again = arena->allocate(kBlock);  // where the first block was (the ring wraps)
  ASSERT_TRUE(again);
  second.reset();
  third.reset();
  again.reset();
  EXPECT_EQ(arena->liveBlocks(), 0u);
}

TEST(SharedArena, APeerRefusesPartsOutsideALiveBlockAndArenasItWasNotAnnounced) {
  std::string why;
  auto arena = SharedArena::create(1 << 20, &why);
  ASSERT_TRUE(arena) << why;
  EXPECT_THROW(PeerArena::open(arena->path(), arena->token() + 1, arena->bytes()), InputError);
  EXPECT_THROW(PeerArena::open(arena->path(), arena->token(), arena->bytes() * 2), InputError);
  EXPECT_THROW(PeerArena::open("/proc/self/fd/100000", 1, 1 << 20), IoError);
  auto peer = PeerArena::open(arena->path(), arena->token(), arena->bytes());
  auto block = arena->allocate(4096);
  const auto offset = arena->share(block.get(), 4096);
  ASSERT_TRUE(offset);
  EXPECT_THROW(peer->take(arena->bytes() - 64, 4096), InputError);  // past the end
  EXPECT_THROW(peer->take(*offset + 8, 64), InputError);            // misaligned
  EXPECT_THROW(peer->take(*offset, 8192), InputError);              // longer than the block
  EXPECT_THROW(peer->take(0, 64), InputError);                      // the arena's header
  auto taken = peer->take(*offset, 4096);                           // the reference share() added
  taken.reset();
  block.reset();
  EXPECT_THROW(peer->take(*offset, 4096), InputError) << "a freed block";
}

TEST_F(TransportTest, SendBuffersCrossNoSocketBetweenPeersOfOneHostAndAreReused) {
  TransportOptions small = options(0, true);
  small.sharedArenaBytes = 4 << 20;
  Peer a(small), b(options(1, true));
  connectPair(a, b);
  expectExchange(a, b);                         // each side has seen the other's arenaMapped by now
  constexpr std::int64_t kFloats = 256 * 1024;  // 1 MiB: 20 of them go round a 4 MiB arena
  std::atomic<int> shared{0}, right{0};
  b.keep = false;
  b.hook = [&](NodeId, IncomingMessage& message) {
    if (message.frame().getShared().size() == 1 && message.frameBuffer().size() < 1024) ++shared;
    Tensor got = message.tensor(message.frame().getGradBucket().getGrads());
    const auto step = static_cast<float>(message.frame().getGradBucket().getStep());
    if (got.numel() == kFloats && got.f32()[0] == step && got.f32()[kFloats - 1] == step) ++right;
  };
  const std::size_t before = b.count();
  for (int i = 0; i < 20; ++i) {
    Tensor t = a.transport->sendBuffer(1, {kFloats});
    std::fill_n(t.f32(), kFloats, static_cast<float>(i));
    a.transport->send(1, gradBucket(i, t));
    ASSERT_TRUE(b.waitMessages(before + i + 1));  // b drops each message at once
  }
  EXPECT_EQ(right.load(), 20);
  EXPECT_EQ(shared.load(), 20) << "a message went through the socket: the arena was not reused";
  EXPECT_TRUE(a.sink->errors().empty());
  EXPECT_TRUE(b.sink->errors().empty());
}

TEST_F(TransportTest, OverTcpASendBufferIsOrdinaryMemoryAndTravelsInTheFrame) {
  Peer a(options(0, false)), b(options(1, false));
  connectPair(a, b);
  expectExchange(a, b);
  Tensor t = a.transport->sendBuffer(1, {256 * 1024});
  std::fill_n(t.f32(), t.numel(), 2.5f);
  a.transport->send(1, gradBucket(3, t));
  ASSERT_TRUE(b.waitMessages(2));
  auto message = b.message(1);
  EXPECT_EQ(message.frame().getShared().size(), 0u);
  Tensor got = message.tensor(message.frame().getGradBucket().getGrads());
  EXPECT_TRUE(inside(got.raw(), message.frameBuffer()));
  EXPECT_EQ(got.f32()[256 * 1024 - 1], 2.5f);
}

// ---- failures ----

TEST_F(TransportTest, SendingToANodeWithoutALinkThrows) {
  Peer a(options(0, false));
  EXPECT_THROW(a.transport->send(9, stepDone(1, 0)), IoError);
  try {
    a.transport->send(9, stepDone(1, 0));
  } catch (const LinkLostError&) {
    ADD_FAILURE() << "node 9 was never linked: not a lost link";
  } catch (const IoError&) {
  }
}

TEST_F(TransportTest, ConnectingToTheWrongNodeIdFails) {
  Peer a(options(0, false)), b(options(1, false));
  EXPECT_THROW(a.transport->connect(5, b.transport->address()), IoError);
}

TEST_F(TransportTest, APeerThatShutsDownIsReportedLost) {
  Peer a(options(0, true));
  auto b = std::make_unique<Peer>(options(1, true));
  connectPair(a, *b);
  b.reset();
  ASSERT_TRUE(a.waitLost(1));
  EXPECT_EQ(a.firstLost(), 1u);
  EXPECT_TRUE(a.sink->errors().empty()) << a.sink->errors().front();  // a clean close is no error
  // A send to the lost peer says so, with why (the actors turn it into the peer's PeerError).
  try {
    a.transport->send(1, stepDone(1, 0));
    ADD_FAILURE() << "a send to a lost link went through";
  } catch (const LinkLostError& e) {
    EXPECT_NE(std::string(e.what()).find("the link to node 1 is lost: "), std::string::npos)
        << e.what();
  }
}

// A raw TCP socket speaking (or not) the frame format, after the authentication handshake
// (with `secret` for run "test-run") unless told not to.
class RawPeer {
 public:
  explicit RawPeer(const std::string& address, bool authenticate = true,
                   const std::string& secret = "")
      : socket_(io_) {
    const auto hostPort = address.substr(6, address.find(';') - 6);
    const auto colon = hostPort.rfind(':');
    socket_.connect({asio::ip::make_address(hostPort.substr(0, colon)),
                     static_cast<std::uint16_t>(std::stoi(hostPort.substr(colon + 1)))});
    if (authenticate) authenticated_ = handshake(secret);
  }
  // Whether the other side's proof was right (ours may still be refused).
  bool authenticated() const { return authenticated_; }
  bool handshake(const std::string& secret) {
    Handshake h(secret, "test-run", true);
    asio::write(socket_, asio::buffer(h.challenge()));
    std::array<std::byte, kChallengeBytes> challenge;
    asio::read(socket_, asio::buffer(challenge));
    h.peerChallenge(challenge);
    asio::write(socket_, asio::buffer(h.proof()));
    std::array<std::byte, kProofBytes> proof;
    asio::error_code error;
    asio::read(socket_, asio::buffer(proof), error);
    return !error && h.verify(proof);
  }
  void write(const std::vector<std::byte>& bytes) { asio::write(socket_, asio::buffer(bytes)); }
  void hello(NodeId node) {
    capnp::MallocMessageBuilder builder;
    auto hello = builder.getRoot<wire::Frame>().initHello();
    hello.setNode(node);
    hello.setRunId("test-run");
    write(frame(builder));
  }
  // The peer closes the link: reading ends (after its Hello, if we sent one).
  bool closedByPeer() {
    if (closedHere_) return true;
    std::array<std::byte, 4096> sink;
    asio::error_code error;
    while (!error)
      socket_.read_some(asio::buffer(sink), error);
    return error == asio::error::eof || error == asio::error::connection_reset;
  }
  void close() {
    socket_.close();
    closedHere_ = true;
  }

  static std::vector<std::byte> frame(capnp::MessageBuilder& builder) {
    auto segments = builder.getSegmentsForOutput();
    std::vector<std::byte> out(segmentTableBytes(static_cast<std::uint32_t>(segments.size())));
    std::uint64_t bytes = 0;
    for (std::size_t s = 0; s < segments.size(); ++s) {
      const auto words = static_cast<std::uint32_t>(segments[s].size());
      std::memcpy(out.data() + 4 * s, &words, 4);
      bytes += words * 8;
    }
    const auto header = encodeFrameHeader(
        {FrameKind::kMessage, static_cast<std::uint32_t>(segments.size()), bytes, 0});
    out.insert(out.begin(), header.begin(), header.end());
    for (auto s : segments) {
      auto b = std::as_bytes(std::span(s.begin(), s.size()));
      out.insert(out.end(), b.begin(), b.end());
    }
    return out;
  }

 private:
  asio::io_context io_;
  asio::ip::tcp::socket socket_;
  bool closedHere_ = false;
  bool authenticated_ = false;
};

// ---- authentication ----

TEST_F(TransportTest, PeersWithTheRunsSecretLinkAndOthersAreRefusedAndLogged) {
  TransportOptions withSecret = options(0, false);
  withSecret.secret = "the-run-secret";
  Peer a(withSecret);
  TransportOptions same = options(1, false);
  same.secret = "the-run-secret";
  Peer b(same);
  connectPair(b, a);
  expectExchange(a, b);
  EXPECT_TRUE(a.sink->errors().empty());

  struct Rogue {
    const char* what;
    std::string secret;
    std::string runId;
  };
  std::size_t refusals = 0;
  for (const Rogue& rogue :
       {Rogue{"wrong secret", "another-secret", "test-run"}, Rogue{"no secret", "", "test-run"},
        Rogue{"another run", "the-run-secret", "other-run"}}) {
    SCOPED_TRACE(rogue.what);
    TransportOptions o = options(2, false);
    o.secret = rogue.secret;
    o.runId = rogue.runId;
    o.connectTimeout = 2s;
    Peer c(o);
    EXPECT_THROW(c.transport->connect(0, a.transport->address()), IoError);
    // a logged the refusal, with where it came from, and never linked node 2.
    const auto errors = a.errorsAfter(refusals);
    ASSERT_EQ(errors.size(), refusals + 1);
    EXPECT_NE(errors.back().find("refused: authentication failed"), std::string::npos)
        << errors.back();
    EXPECT_NE(errors.back().find("tcp://127.0.0.1:"), std::string::npos) << errors.back();
    EXPECT_TRUE(a.linkAddressless(2));
    ++refusals;
  }
  expectExchange(a, b);  // the run's own link is untouched
}

TEST_F(TransportTest, NothingARefusedPeerSendsIsRead) {
  TransportOptions o = options(0, false);
  o.secret = "the-run-secret";
  Peer a(o);
  RawPeer rogue(a.transport->address(), true, "a-guess");
  EXPECT_FALSE(rogue.authenticated());
  rogue.hello(7);  // would register node 7 if it were read
  EXPECT_TRUE(rogue.closedByPeer());
  EXPECT_THROW(a.transport->waitForPeer(7, 300ms), TimeoutError);
  EXPECT_EQ(a.count(), 0u);
}

TEST_F(TransportTest, APeerThatNeverAuthenticatesIsDroppedAfterTheTimeout) {
  TransportOptions o = options(0, false);
  o.handshakeTimeout = 300ms;
  Peer a(o);
  RawPeer silent(a.transport->address(), false);
  EXPECT_TRUE(silent.closedByPeer());
  const auto errors = a.errorsAfter(0);
  ASSERT_EQ(errors.size(), 1u);
  EXPECT_NE(errors[0].find("no authentication handshake within 300 ms"), std::string::npos)
      << errors[0];
}

// ---- strangers and impostors ----

std::string unixPart(const std::string& address) {
  const auto at = address.find(";unix://");
  return at == std::string::npos ? "" : address.substr(at + 8);
}

TEST_F(TransportTest, TheUnixSocketIsAbstractSoNothingOnDiskCanBePlantedOrLeftBehind) {
  // What another user could do to a socket in a guessable folder: plant the folder, or a
  // directory where the socket goes. Neither reaches an abstract socket.
  const mode_t previous = ::umask(0);
  const std::filesystem::path planted = "/tmp/troupe-test-run";
  std::filesystem::create_directories(planted / "node0.sock");
  {
    Peer a(options(0, true)), b(options(1, true));
    const std::string name = unixPart(a.transport->address());
    ASSERT_EQ(name.rfind("@troupe-test-run-node0-", 0), 0u) << a.transport->address();
    EXPECT_NE(name, unixPart(Peer(options(0, true)).transport->address()))
        << "another process of the same run id and node gets another name";
    b.transport->connect(0, a.transport->address());
    a.transport->waitForPeer(1, 5s);
    EXPECT_EQ(b.transport->linkAddress(0), "unix://" + name);
    expectExchange(a, b);
  }
  ::umask(previous);
  EXPECT_TRUE(std::filesystem::is_directory(planted / "node0.sock")) << "left as it was";
  std::filesystem::remove_all(planted);
  for (const auto& entry : std::filesystem::directory_iterator("/tmp")) {
    EXPECT_EQ(entry.path().filename().string().rfind("troupe-test-run", 0), std::string::npos)
        << "the transport wrote " << entry.path();
  }
}

TEST_F(TransportTest, AUnixConnectionOfAnotherUserIsRefusedNamingItsPidAndUid) {
  if (::geteuid() != 0) GTEST_FAIL() << "needs root, to connect as another user";
  Peer a(options(0, true));
  const std::string name = unixPart(a.transport->address());
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    if (::setuid(65534) != 0) ::_exit(2);
    const int fd = ::socket(AF_UNIX, SOCK_STREAM, 0);
    sockaddr_un address{};
    address.sun_family = AF_UNIX;
    std::memcpy(address.sun_path + 1, name.data() + 1, name.size() - 1);
    const auto length = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + name.size());
    if (::connect(fd, reinterpret_cast<sockaddr*>(&address), length) != 0) ::_exit(3);
    char byte;
    ::_exit(::read(fd, &byte, 1) == 0 ? 0 : 4);  // closed at once, before any byte
  }
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "status " << status;
  const auto errors = a.errorsAfter(0);
  ASSERT_EQ(errors.size(), 1u);
  EXPECT_NE(errors[0].find("pid " + std::to_string(child)), std::string::npos) << errors[0];
  EXPECT_NE(errors[0].find("uid 65534"), std::string::npos) << errors[0];
}

TEST_F(TransportTest, APeerOfAnotherIncarnationIsRefusedAndBothSidesNameBoth) {
  for (const bool unixSocket : {false, true}) {
    TransportOptions ao = options(0, unixSocket), bo = options(1, unixSocket);
    ao.secret = bo.secret = "one secret";
    ao.incarnation = "run-a-0001";
    bo.incarnation = "run-b-0002";
    Peer a(ao), b(bo);
    try {
      b.transport->connect(0, a.transport->address());
      FAIL() << "linked to a process of another incarnation";
    } catch (const IoError& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find("run-a-0001"), std::string::npos) << what;
      EXPECT_NE(what.find("run-b-0002"), std::string::npos) << what;
    }
    const auto errors = a.errorsAfter(0);
    ASSERT_FALSE(errors.empty());
    EXPECT_NE(errors[0].find("run-a-0001"), std::string::npos) << errors[0];
    EXPECT_NE(errors[0].find("run-b-0002"), std::string::npos) << errors[0];
    EXPECT_TRUE(a.linkAddressless(1));
  }
}

TEST_F(TransportTest, ASecondProcessClaimingALinkedNodeIsRefusedAndTheFirstLinkGoesOn) {
  Peer a(options(0, false)), b(options(1, false)), impostor(options(1, false));
  connectPair(b, a);
  try {
    impostor.transport->connect(0, a.transport->address());
    FAIL() << "a second node 1 was linked";
  } catch (const IoError& e) {
    EXPECT_NE(std::string(e.what()).find("linked already"), std::string::npos) << e.what();
  }
  const auto errors = a.errorsAfter(0);
  ASSERT_FALSE(errors.empty());
  EXPECT_NE(errors[0].find("node 1 is linked already"), std::string::npos) << errors[0];
  EXPECT_EQ(a.lostCount(), 0u);
  expectExchange(a, b);
}

TEST_F(TransportTest, SilentStrangersHoldAtMostTheirSlotsAndALatePeerStillLinks) {
  TransportOptions ao = options(0, false);
  ao.maxPendingHandshakes = 4;
  ao.handshakeTimeout = 1s;
  // b's own connect timeout is no second clock racing the strangers' (a loaded machine's accept
  // times once ran past it): how soon b gets in is not what this test says, that it does is.
  TransportOptions bo = options(1, false);
  bo.connectTimeout = 30s;
  Peer a(ao), b(bo);
  constexpr int kStrangers = 10;
  std::vector<std::unique_ptr<RawPeer>> strangers;
  for (int i = 0; i < kStrangers; ++i)
    strangers.push_back(std::make_unique<RawPeer>(a.transport->address(), false));
  // The strangers beyond 4 wait in the backlog; b waits behind them and gets in as their slots
  // time out, 4 a handshake timeout: not before 10 / 4 = 2 of them, which no load shortens.
  const auto start = std::chrono::steady_clock::now();
  b.transport->connect(0, a.transport->address());
  a.transport->waitForPeer(1, 30s);
  EXPECT_GE(std::chrono::steady_clock::now() - start,
            (kStrangers / ao.maxPendingHandshakes) * ao.handshakeTimeout - 100ms)
      << "the strangers did not hold their slots";
  expectExchange(a, b);
  // A warning when the slots fill, at a bounded rate, counting at most the slots' worth.
  EXPECT_GE(a.sink->countLines("4 connections have not authenticated yet; accepting pauses"), 1u);
}

TEST_F(TransportTest, AcceptFailuresBackOffAndAreLoggedAtABoundedRate) {
  Peer a(options(0, false));
  rlimit previous{};
  ASSERT_EQ(::getrlimit(RLIMIT_NOFILE, &previous), 0);
  std::size_t open = 0;
  for ([[maybe_unused]] const auto& e : std::filesystem::directory_iterator("/proc/self/fd"))
    ++open;
  // A child opens 40 connections; this process runs out of descriptors after a few accepts.
  rlimit tight = previous;
  tight.rlim_cur = open + 4;
  ASSERT_EQ(::setrlimit(RLIMIT_NOFILE, &tight), 0);
  const std::string address = a.transport->address();
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    ::setrlimit(RLIMIT_NOFILE, &previous);
    const auto hostPort = address.substr(6);
    const auto colon = hostPort.rfind(':');
    sockaddr_in to{};
    to.sin_family = AF_INET;
    to.sin_port = htons(static_cast<std::uint16_t>(std::stoi(hostPort.substr(colon + 1))));
    ::inet_pton(AF_INET, hostPort.substr(0, colon).c_str(), &to.sin_addr);
    for (int i = 0; i < 40; ++i) {
      const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
      ::connect(fd, reinterpret_cast<sockaddr*>(&to), sizeof to);
    }
    ::sleep(3);
    ::_exit(0);
  }
  std::this_thread::sleep_for(2500ms);
  const std::size_t reports = a.sink->countLines("accept failed");
  ::setrlimit(RLIMIT_NOFILE, &previous);
  int status = 0;
  ::waitpid(child, &status, 0);
  // 2.5 s of failing accepts: one report a second at most (before: one per failure, thousands).
  EXPECT_GE(reports, 1u);
  EXPECT_LE(reports, 4u);
}

// ---- heartbeats ----

TEST_F(TransportTest, AnIdleLinkStaysUpOnHeartbeats) {
  TransportOptions ao = options(0, false), bo = options(1, true);
  for (auto* o : {&ao, &bo}) {
    o->heartbeatInterval = 50ms;
    o->peerTimeout = 1000ms;
  }
  Peer a(ao), b(bo);
  connectPair(a, b);
  std::this_thread::sleep_for(2500ms);  // nothing to say for two and a half timeouts
  EXPECT_EQ(a.lostCount(), 0u);
  EXPECT_EQ(b.lostCount(), 0u);
  expectExchange(a, b);
}

TEST_F(TransportTest, APeerThatFallsSilentIsDroppedAfterThePeerTimeoutNamingIt) {
  TransportOptions o = options(0, false);
  o.heartbeatInterval = 50ms;
  o.peerTimeout = 400ms;
  Peer a(o);
  RawPeer hung(a.transport->address());  // authenticates, says Hello, then nothing
  hung.hello(7);
  a.transport->waitForPeer(7, 5s);
  const auto start = std::chrono::steady_clock::now();
  ASSERT_TRUE(a.waitLost(1, 5s));
  EXPECT_GE(std::chrono::steady_clock::now() - start, 300ms);
  EXPECT_EQ(a.firstLost(), 7u);
  ASSERT_EQ(a.sink->errors().size(), 1u);
  EXPECT_NE(a.sink->errors()[0].find("node 7"), std::string::npos) << a.sink->errors()[0];
  EXPECT_NE(a.sink->errors()[0].find("not even a heartbeat"), std::string::npos)
      << a.sink->errors()[0];
}

TEST_F(TransportTest, SomethingOtherThanAHandshakeIsRefused) {
  Peer a(options(0, false));
  RawPeer stranger(a.transport->address(), false);
  stranger.write(garbageBytes(100));
  EXPECT_TRUE(stranger.closedByPeer());
  const auto errors = a.errorsAfter(0);
  ASSERT_EQ(errors.size(), 1u);
  EXPECT_NE(errors[0].find("refused: not a troupe peer"), std::string::npos) << errors[0];
}

TEST_F(TransportTest, AFloodOfStrangersIsCountedInFullAndSummarisedWhileTheLinksGoOn) {
  const auto begin = std::chrono::steady_clock::now();
  Peer a(options(0, false)), b(options(1, false));
  const std::string address = a.transport->address();
  const auto port = static_cast<std::uint16_t>(std::stoi(address.substr(address.rfind(':') + 1)));
  constexpr int kStrangers = 2000;
  ASSERT_EQ(testing::floodWithGarbage(port, kStrangers), kStrangers);
  connectPair(b, a);
  expectExchange(a, b);
  // The refusals past the burst are summarised once a token is back (5 s after the burst), while
  // the transport runs on.
  testing::RefusalLines refusals;
  const auto deadline = std::chrono::steady_clock::now() + 30s;
  do {
    std::this_thread::sleep_for(50ms);
    refusals = testing::countRefusals(a.sink->errors(), "): refused: not a troupe peer");
  } while (refusals.connections < static_cast<std::uint64_t>(kStrangers) &&
           std::chrono::steady_clock::now() < deadline);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - begin).count();
  EXPECT_EQ(refusals.connections, static_cast<std::uint64_t>(kStrangers));
  // Default limits: 10 lines one by one, then one line (here the summary) a token, a token every
  // 5 s (before: one line per connection).
  EXPECT_LE(refusals.lines, 10 + static_cast<std::size_t>(seconds / 5));
  ASSERT_FALSE(refusals.summaries.empty());
  const std::string& summary = refusals.summaries.back();
  EXPECT_NE(summary.find("transport node 0 " + address + ": "), std::string::npos) << summary;
  EXPECT_NE(summary.find(" not a troupe peer); the last from tcp://127.0.0.1:"), std::string::npos)
      << summary;
  expectExchange(a, b);
}

std::vector<std::byte> headerBytes(FrameHeader header) {
  auto h = encodeFrameHeader(header);
  return {h.begin(), h.end()};
}

struct BadPeerCase {
  const char* name;
  bool hello;  // the raw peer introduces itself as node 7 first
  std::function<void(RawPeer&)> misbehave;
  const char* error;  // expected in the one logged error
};

class BadPeerTest : public TransportTest, public ::testing::WithParamInterface<BadPeerCase> {};

TEST_P(BadPeerTest, DropsOnlyThatLinkWithOneLoggedError) {
  const auto& param = GetParam();
  TransportOptions bOptions = options(1, false);
  bOptions.traversalLimitWords = 4096;
  Peer a(options(0, false)), b(bOptions);
  connectPair(a, b);
  RawPeer raw(b.transport->address());
  if (param.hello) {
    raw.hello(7);
    b.transport->waitForPeer(7, 5s);
  }
  param.misbehave(raw);
  if (param.hello) {
    ASSERT_TRUE(b.waitLost(1));
    EXPECT_EQ(b.firstLost(), 7u);
  }
  EXPECT_TRUE(raw.closedByPeer());
  const auto errors = b.errorsAfter(0);
  ASSERT_EQ(errors.size(), 1u);
  EXPECT_NE(errors[0].find(param.error), std::string::npos) << errors[0];
  EXPECT_NE(errors[0].find(param.hello ? "node 7" : "node ?"), std::string::npos) << errors[0];
  EXPECT_NE(errors[0].find("tcp://127.0.0.1:"), std::string::npos) << errors[0];
  // The healthy link goes on.
  expectExchange(a, b);
  EXPECT_EQ(a.lostCount(), 0u);
  EXPECT_TRUE(a.sink->errors().empty());
}

std::vector<std::byte> garbage(std::size_t n) {
  return garbageBytes(n);
}

INSTANTIATE_TEST_SUITE_P(
    Transport, BadPeerTest,
    ::testing::Values(
        BadPeerCase{"GarbageBytes", true, [](RawPeer& p) { p.write(garbage(100)); },
                    "bad frame magic"},
        BadPeerCase{"GarbageBeforeAnyHello", false, [](RawPeer& p) { p.write(garbage(100)); },
                    "bad frame magic"},
        BadPeerCase{"OversizedHeader", true,
                    [](RawPeer& p) {
                      p.write(headerBytes({FrameKind::kMessage, 1, std::uint64_t{1} << 30, 0}));
                    },
                    "over the frame limit"},
        BadPeerCase{"TooManySegments", true,
                    [](RawPeer& p) {
                      p.write(headerBytes({FrameKind::kMessage, 100000, 64, 0}));
                    },
                    "malformed segment table"},
        BadPeerCase{"SegmentTableNotMatchingTheFrame", true,
                    [](RawPeer& p) {
                      auto bytes = headerBytes({FrameKind::kMessage, 2, 64, 0});
                      const std::uint32_t sizes[2] = {1, 1000};
                      const auto* s = reinterpret_cast<const std::byte*>(sizes);
                      bytes.insert(bytes.end(), s, s + 8);
                      p.write(bytes);
                    },
                    "malformed segment table"},
        BadPeerCase{"GarbageSegments", true,
                    [](RawPeer& p) {
                      auto bytes = headerBytes({FrameKind::kMessage, 1, 64, 0});
                      const std::uint32_t sizes[2] = {8, 0};
                      const auto* s = reinterpret_cast<const std::byte*>(sizes);
                      bytes.insert(bytes.end(), s, s + 8);
                      auto junk = garbage(64);
                      bytes.insert(bytes.end(), junk.begin(), junk.end());
                      p.write(bytes);
                    },
                    "malformed message"},
        BadPeerCase{"BulkChunkWithoutAMessage", true,
                    [](RawPeer& p) {
                      auto bytes = headerBytes({FrameKind::kBulk, 0, 8, 0});
                      bytes.resize(bytes.size() + 8);
                      p.write(bytes);
                    },
                    "without a message"},
        BadPeerCase{"ClosingMidFrame", true,
                    [](RawPeer& p) {
                      auto bytes = headerBytes({FrameKind::kMessage, 1, 1024, 0});
                      bytes.resize(bytes.size() + 8 + 100);
                      bytes[kFrameHeaderBytes] = std::byte{128};  // 128 words
                      p.write(bytes);
                      p.close();
                    },
                    "mid-frame"},
        BadPeerCase{"NestedTooDeep", true,
                    [](RawPeer& p) {
                      capnp::MallocMessageBuilder builder;
                      auto pointer = builder.getRoot<capnp::AnyPointer>();
                      for (int i = 0; i < 100; ++i) {
                        pointer = pointer.initAsAnyStruct(0, 1).getPointerSection()[0];
                      }
                      p.write(RawPeer::frame(builder));
                    },
                    "nested"},
        BadPeerCase{"SharedPartsOverALinkWithoutAnArena", true,
                    [](RawPeer& p) {
                      capnp::MallocMessageBuilder builder;
                      auto frame = builder.getRoot<wire::Frame>();
                      frame.initGradBucket().initGrads().setSharedPart(0);
                      auto part = frame.initShared(1)[0];
                      part.setOffset(128);
                      part.setBytes(4096);
                      p.write(RawPeer::frame(builder));
                    },
                    "no shared arena"},
        BadPeerCase{"APointerOfTheWrongKind", true,
                    [](RawPeer& p) {
                      // Found by tests/fuzz/frame_fuzz: within the limits, but no GradBucket.
                      capnp::MallocMessageBuilder builder;
                      auto bucket = builder.getRoot<wire::Frame>().initGradBucket();
                      capnp::toAny(bucket).getPointerSection()[0].initAs<capnp::List<capnp::Text>>(
                          2);
                      p.write(RawPeer::frame(builder));
                    },
                    "malformed message"},
        BadPeerCase{"OverTheTraversalLimit", true,
                    [](RawPeer& p) {
                      capnp::MallocMessageBuilder builder;
                      auto grads = builder.getRoot<wire::Frame>().initGradBucket().initGrads();
                      grads.initData(64 * 1024);  // 8192 words, limit 4096
                      p.write(RawPeer::frame(builder));
                    },
                    "traversal limit"}),
    [](const ::testing::TestParamInfo<BadPeerCase>& info) { return info.param.name; });

// ---- throughput ----

TEST_F(TransportTest, OneWayThroughputOverLoopback) {
  for (bool unixSocket : {false, true}) {
    Peer a(options(0, unixSocket)), b(options(1, unixSocket));
    connectPair(a, b);
    std::atomic<std::uint64_t> received{0};
    b.keep = false;  // buffers go back to the receive pool at once
    b.hook = [&](NodeId, IncomingMessage& message) {
      received += message.tensor(message.frame().getGradBucket().getGrads()).bytes();
    };
    for (std::int64_t megabytes : {25, 100}) {
      const std::int64_t floats = megabytes * 1'000'000 / 4;
      Tensor payload = iota(floats);
      const int count = megabytes == 25 ? 12 : 4;
      a.transport->send(1, gradBucket(0, payload));  // warm-up
      const std::size_t before = b.count() + 1;
      ASSERT_TRUE(b.waitMessages(before, 20s));
      received = 0;
      const auto start = std::chrono::steady_clock::now();
      for (int i = 0; i < count; ++i)
        a.transport->send(1, gradBucket(i, payload));
      ASSERT_TRUE(b.waitMessages(before + count, 60s));
      const double seconds =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      const double gbps = static_cast<double>(received.load()) / seconds / 1e9;
      const std::string key =
          std::string(unixSocket ? "unix_" : "tcp_") + std::to_string(megabytes) + "MB_GBps";
      char value[32];
      std::snprintf(value, sizeof value, "%.2f", gbps);
      RecordProperty(key, value);
      std::printf("[ throughput ] %-16s %s GB/s (%d x %lld MB)\n", key.c_str(), value, count,
                  static_cast<long long>(megabytes));
    }
  }
}

}  // namespace
}  // namespace troupe::transport
