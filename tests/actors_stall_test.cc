// Waits on other processes end: the reducer's ring and a parameter server log a stall report
// naming who is late, then fail the run after the peer timeout.
#include <gtest/gtest.h>
#include <spdlog/spdlog.h>

#include <chrono>
#include <sstream>

#include "actors/messages.h"
#include "actors/roles.h"
#include "actors/system.h"
#include "log_capture.h"
#include "troupe/error.h"

namespace troupe::actors {
namespace {

using namespace std::chrono_literals;

using testing::LogCapture;

// An actor system whose messages to other nodes vanish: the other processes never answer.
std::unique_ptr<ActorSystem> systemWithSilentPeers() {
  SystemOptions options;
  options.node = 0;
  options.remote = [](Address, Address, std::unique_ptr<Envelope>) {};
  return makeActorSystem(options);
}

// Runs `system` and returns its failure, or "" if it ended normally.
std::string failureOf(ActorSystem& system) {
  try {
    system.run();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(Stalls, ABucketTheRingNeverReturnsIsReportedThenFailsNamingThePreviousRank) {
  LogCapture log;
  auto system = systemWithSilentPeers();
  ReducerConfig config;
  config.rank = 0;
  config.world = 3;
  config.next = Address{1, 2};
  config.updater = Address{0, 5};
  config.stall_warning = 150ms;
  config.peer_timeout = 600ms;
  const Address reducer = system->spawn(makeReducer("reducer", config));
  system->tell(reducer, GradBucket{7, 0, 0, 1000, Tensor::host({1000})});
  const auto start = std::chrono::steady_clock::now();
  const std::string failure = failureOf(*system);
  EXPECT_GE(std::chrono::steady_clock::now() - start, 600ms);
  EXPECT_NE(failure.find("rank 0: the allreduce of bucket [0,1000) of step 7"), std::string::npos)
      << failure;
  EXPECT_NE(failure.find("ring chunks from rank 2"), std::string::npos) << failure;
  EXPECT_NE(log.text().find("stall: rank 0 has waited"), std::string::npos) << log.text();
  EXPECT_NE(log.text().find("for rank 2 to send ring chunks of bucket [0,1000)"), std::string::npos)
      << log.text();
}

TEST(Stalls, AServerNamesTheWorkersAPullWaitsForThenFails) {
  LogCapture log;
  auto system = systemWithSilentPeers();
  ServerConfig config;
  config.num_workers = 3;
  config.mode = "dist_sync";
  config.key_begin = 0;
  config.key_end = 10;
  config.initial_weights = Tensor::host({10});
  config.stall_warning = 150ms;
  config.peer_timeout = 600ms;
  const Address server = system->spawn(makeServer("server", config));
  // Workers 0 and 2 push step 0; worker 1 never does; worker 0 pulls step 1.
  system->tell(server, Push{0, 0, 0, 10, Tensor::host({10})});
  system->tell(server, Push{0, 2, 0, 10, Tensor::host({10})});
  system->tell(server, Pull{1, 0, false});
  const std::string failure = failureOf(*system);
  EXPECT_NE(failure.find("server 0: worker 0's pull of step 1 waited"), std::string::npos)
      << failure;
  EXPECT_NE(failure.find("worker 1 (pushed through step -1)"), std::string::npos) << failure;
  EXPECT_EQ(failure.find("worker 2"), std::string::npos) << failure;
  EXPECT_NE(log.text().find("stall: server 0 has held worker 0's pull of step 1"),
            std::string::npos)
      << log.text();
}

}  // namespace
}  // namespace troupe::actors
