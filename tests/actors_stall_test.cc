// Waits on other processes end: the reducer's ring, a parameter server and a worker's PS client log
// a stall report naming who is late by role and rank, then fail the run after the peer timeout
// with a PeerError that names the culprit.
#include <gtest/gtest.h>
#include <spdlog/spdlog.h>

#include <chrono>
#include <optional>
#include <sstream>

#include "actors/core/messages.h"
#include "actors/core/peer.h"
#include "actors/core/system.h"
#include "actors/roles/roles.h"
#include "log_capture.h"
#include "troupe/error.h"

namespace troupe::actors {
namespace {

using namespace std::chrono_literals;

using testing::LogCapture;

// An actor system whose messages to other nodes vanish: the other processes never answer.
std::unique_ptr<Runtime> systemWithSilentPeers() {
  SystemOptions options;
  options.node = 0;
  options.remote = [](Address, Address, std::unique_ptr<Envelope>) {};
  return makeRuntime(options);
}

// Fails the system after `after`: a watch that never fires fails its test instead of hanging it.
void failAfter(Runtime& system, std::chrono::milliseconds after) {
  struct Deadline final : Actor {
    explicit Deadline(std::chrono::milliseconds after) : Actor("deadline") {
      on<StallCheck>([after](StallCheck&) -> void {
        throw TimeoutError(
            "nothing failed within " +
            std::to_string(std::chrono::duration_cast<std::chrono::seconds>(after).count()) + " s");
      });
    }
  };
  system.after(after, system.spawn(std::make_unique<Deadline>(after)), StallCheck{});
}

struct Failure {
  std::string what;  // "" if the system ended normally
  std::optional<PeerError> peer;
};

// Runs `system` and returns how it failed.
Failure failureOf(Runtime& system) {
  try {
    system.run();
  } catch (const Error& e) {
    return {e.what(), findPeerError(e)};
  }
  return {};
}

TEST(Stalls, ABucketTheRingNeverReturnsIsReportedThenFailsNamingThePreviousWorker) {
  LogCapture log;
  auto system = systemWithSilentPeers();
  ReducerConfig config;
  config.rank = 0;
  config.world = 3;
  config.next = Address{1, 2};
  config.updater = Address{0, 5};
  config.run.stall_warning = 150ms;
  config.run.peer_timeout = 600ms;
  const Address reducer = system->spawn(makeReducer("reducer", config));
  system->tell(reducer, GradBucket{7, 0, 0, 1000, Tensor::host({1000}), {}});
  const auto start = std::chrono::steady_clock::now();
  const auto [failure, peer] = failureOf(*system);
  EXPECT_GE(std::chrono::steady_clock::now() - start, 600ms);
  EXPECT_NE(failure.find("worker 0: the allreduce of bucket [0,1000) of step 7"), std::string::npos)
      << failure;
  EXPECT_NE(failure.find("ring chunks from worker 2"), std::string::npos) << failure;
  ASSERT_TRUE(peer.has_value()) << failure;
  EXPECT_EQ(peer->culpritLine().rfind("troupe-culprit: worker 2: no ring chunks of step 7", 0), 0u)
      << peer->culpritLine();
  EXPECT_NE(log.text().find("stall: worker 0 has waited"), std::string::npos) << log.text();
  EXPECT_NE(log.text().find("for worker 2 to send ring chunks of bucket [0,1000)"),
            std::string::npos)
      << log.text();
}

// What a worker's pull hears from the server that holds it.
struct HeldNotices final : Actor {
  explicit HeldNotices(std::shared_ptr<std::vector<PullHeld>> heard)
      : Actor("worker 0's client"), heard_(std::move(heard)) {
    on<PullHeld>([this](PullHeld& h) { heard_->push_back(h); });
  }
  std::shared_ptr<std::vector<PullHeld>> heard_;
};

// A server of `workers` workers holding keys [0, keys), all 0.
ServerConfig serverOf(int workers, ServerConfig::Mode mode, std::int64_t keys) {
  ServerConfig config;
  config.num_workers = workers;
  config.mode = mode;
  config.key_begin = 0;
  config.key_end = keys;
  config.initial_weights = Tensor::host({keys});
  return config;
}

TEST(Stalls, AServerNamesTheWorkersAPullWaitsForThenFails) {
  LogCapture log;
  auto system = systemWithSilentPeers();
  auto heard = std::make_shared<std::vector<PullHeld>>();
  ServerConfig config = serverOf(3, ServerConfig::Mode::kSync, 10);
  config.run.stall_warning = 150ms;
  config.run.peer_timeout = 600ms;
  const Address server = system->spawn(makeServer("server", config));
  const Address client = system->spawn(std::make_unique<HeldNotices>(heard));
  // Workers 0 and 2 push step 0; worker 1 never does; worker 0 pulls step 1.
  system->tell(server, Push{0, 0, 0, 10, Tensor::host({10})});
  system->tell(server, Push{0, 2, 0, 10, Tensor::host({10})});
  system->tell(server, Pull{1, 0, false, 0, 10, client.actor});
  const auto [failure, peer] = failureOf(*system);
  EXPECT_NE(failure.find("server 0: worker 0's pull of step 1 waited"), std::string::npos)
      << failure;
  EXPECT_NE(failure.find("worker 1 (pushed through step -1)"), std::string::npos) << failure;
  EXPECT_EQ(failure.find("worker 2"), std::string::npos) << failure;
  ASSERT_TRUE(peer.has_value()) << failure;
  EXPECT_EQ(peer->culpritLine(),
            "troupe-culprit: worker 1: server 0 waited 0.6 s (peer_timeout) for its push of step 0 "
            "(it pushed through step -1)");
  EXPECT_NE(log.text().find("stall: server 0 has held worker 0's pull of step 1"),
            std::string::npos)
      << log.text();
  // The worker heard whom its pull waits for once it was held a while (and maybe, the system
  // failing at once, the server's last word as it gave up).
  ASSERT_GE(heard->size(), 1u);
  EXPECT_FALSE(heard->front().final);
  EXPECT_EQ(heard->front().late_worker, 1);
  EXPECT_EQ(heard->front().reason,
            "server 0 holds worker 0's pull of step 1 for worker 1 (pushed through step -1)");
  if (heard->size() == 2) {
    EXPECT_TRUE(heard->back().final);
    EXPECT_NE(heard->back().reason.find("server 0: worker 0's pull of step 1 waited"),
              std::string::npos)
        << heard->back().reason;
  }
}

// A worker's client that keeps the weights of each pull's answer, and ends the system at the
// `last`-th.
struct PulledWeights final : Actor {
  PulledWeights(Runtime& system, int last, std::shared_ptr<std::vector<float>> got)
      : Actor("worker 0's client") {
    on<PullReply>([this, &system, last, got](PullReply& r) {
      got->assign(r.data.f32(), r.data.f32() + r.data.numel());
      if (++answers_ == last) system.shutdown();
    });
  }
  int answers_ = 0;
};

// dist_async: a push lands at 1/W of the learning rate, and at 1/(tau + 1) where its measured
// staleness tau (the updates between the answer to its pull and it) is more than W - 1. A worker
// that stalled while the others pushed on moves the weights less: its late gradient at 1/W, with
// momentum 0.9, threw a LeNet run under dist_async off in CI twice (loss NaN at steps 83 and 57).
TEST(Stalls, AnAsynchronousPushAfterAStallIsScaledByItsMeasuredStaleness) {
  auto system = systemWithSilentPeers();
  auto got = std::make_shared<std::vector<float>>();
  ServerConfig config = serverOf(2, ServerConfig::Mode::kAsync, 1);
  config.optimizer.momentum = 0.0f;
  config.optimizer.weight_decay = 0.0f;
  config.lr.base = 0.5f;
  const Address server = system->spawn(makeServer("server", config));
  const Address client = system->spawn(std::make_unique<PulledWeights>(*system, 2, got));
  const auto one = [] {
    auto t = Tensor::host({1});
    t.f32()[0] = 1.0f;
    return t;
  };
  // Worker 0 reads step 1's weights. Worker 1 pushes steps 0 to 3, each at 1/W (its weights were
  // not read here: staleness 0). Worker 0's push of step 1 comes 4 updates after its read: at
  // 1/5. Worker 0 then reads step 2's weights.
  system->tell(server, Pull{1, 0, false, 0, 1, client.actor});
  for (std::int64_t step = 0; step < 4; ++step)
    system->tell(server, Push{step, 1, 0, 1, one()});
  system->tell(server, Push{1, 0, 0, 1, one()});
  system->tell(server, Pull{2, 0, false, 0, 1, client.actor});
  failAfter(*system, 10s);
  system->run();
  ASSERT_EQ(got->size(), 1u);
  EXPECT_FLOAT_EQ(got->front(), -4 * (0.5f / 2) - 0.5f / 5) << "1/W would give -1.25";
}

TEST(Stalls, APullNoServerAnswersIsReportedThenFailsNamingTheServerAGraceAfterThePeerTimeout) {
  LogCapture log;
  auto system = systemWithSilentPeers();
  PsClientConfig config;
  config.worker = 1;
  config.initial_weights = Tensor::host({10});
  config.servers = {Address{2, 0}, Address{3, 0}};
  config.shards = shardKeys(10, 2);
  config.plan.steps_per_epoch = 5;
  config.plan.last_step = 10;
  config.run.stall_warning = 150ms;
  config.run.peer_timeout = 600ms;
  // The client pulls step 0's weights as it starts; no server ever answers.
  system->spawn(makePsClient("ps-client", config));
  failAfter(*system, 10s);
  const auto start = std::chrono::steady_clock::now();
  const auto [failure, peer] = failureOf(*system);
  const auto waited = std::chrono::steady_clock::now() - start;
  EXPECT_GE(waited, 600ms + peerTimeoutGrace(150ms, 600ms));
  EXPECT_LT(waited, 600ms + peerTimeoutGrace(150ms, 600ms) + 1s);
  EXPECT_NE(failure.find("worker 1: no answer from server 0, server 1 to its pull of step 0 "
                         "(epoch 1)"),
            std::string::npos)
      << failure;
  ASSERT_TRUE(peer.has_value()) << failure;
  EXPECT_EQ(peer->culpritLine(),
            "troupe-culprit: server 0: no pull answer for step 0 (epoch 1) within 1.6 s "
            "(peer_timeout 0.6 s + grace)");
  EXPECT_NE(log.text().find("stall: worker 1 has waited "), std::string::npos) << log.text();
  EXPECT_NE(log.text().find(" s for server 0, server 1 to answer its pull of step 0 (epoch 1)"),
            std::string::npos)
      << log.text();
}

TEST(Stalls, PeersAreNamedByRoleRankAndAddressNeverByNodeIdAlone) {
  RunMembers members(2, 1);
  members.setAddresses({"tcp://10.0.0.1:4000;unix:///tmp/a", "tcp://10.0.0.2:4001",
                        "tcp://10.0.0.3:4002;unix:///tmp/c"});
  EXPECT_EQ(members.ofNode(0).str(), "worker 0 at 10.0.0.1:4000");
  EXPECT_EQ(members.ofNode(1).str(), "worker 1 at 10.0.0.2:4001");
  EXPECT_EQ(members.ofNode(2).str(), "server 0 at 10.0.0.3:4002");
  EXPECT_EQ(members.server(0).str(), "server 0 at 10.0.0.3:4002");
  EXPECT_EQ(RunMembers(2, 1).ofNode(2).str(), "server 0");
  const auto lost = lostLinkError(members.ofNode(2, "tcp://10.0.0.3:4002;unix://@x"),
                                  "nothing arrived for 6000 ms");
  EXPECT_STREQ(lost.what(),
               "lost the link to server 0 at 10.0.0.3:4002: nothing arrived for 6000 ms");
  EXPECT_EQ(lost.culpritLine(),
            "troupe-culprit: server 0: lost the link (nothing arrived for 6000 ms)");
}

// A failure of an actor's handler reaches run()'s caller with the actor's exception nested, so a
// PeerError thrown deep in an actor is still found for the culprit line.
TEST(Stalls, APeerErrorThrownInAnActorIsFoundInWhatRunThrows) {
  struct Thrower final : Actor {
    Thrower() : Actor("thrower") {
      on<StallCheck>([](StallCheck&) -> void {
        throw PeerError({"server", 3, ""}, "gone", "server 3 is gone");
      });
    }
  };
  auto system = systemWithSilentPeers();
  system->tell(system->spawn(std::make_unique<Thrower>()), StallCheck{});
  const auto [failure, peer] = failureOf(*system);
  EXPECT_EQ(failure, "actor 'thrower' failed handling StallCheck: server 3 is gone");
  ASSERT_TRUE(peer.has_value());
  EXPECT_EQ(peer->culpritLine(), "troupe-culprit: server 3: gone");
}

}  // namespace
}  // namespace troupe::actors
