// The refusal report every listener logs through: counts, lines one by one while quiet, summaries
// at a bounded rate under a flood. Time is given, not waited for.
#include "transport/refusal_report.h"

#include <gtest/gtest.h>
#include <spdlog/sinks/base_sink.h>
#include <spdlog/spdlog.h>

#include <chrono>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "refusal_flood.h"

namespace troupe::transport {
namespace {

using namespace std::chrono_literals;
using Clock = RefusalReport::Clock;

class LineSink final : public spdlog::sinks::base_sink<std::mutex> {
 public:
  std::vector<std::string> lines() {
    std::lock_guard lock(mutex_);
    return lines_;
  }

 protected:
  void sink_it_(const spdlog::details::log_msg& msg) override {
    lines_.emplace_back(msg.payload.data(), msg.payload.size());
  }
  void flush_() override {}

 private:
  std::vector<std::string> lines_;
};

struct Fixture {
  std::shared_ptr<LineSink> sink = std::make_shared<LineSink>();
  std::shared_ptr<spdlog::logger> log = std::make_shared<spdlog::logger>("refusals", sink);
  // Later than any report's making: the bucket is full there, and times count from the first
  // refusal exactly.
  Clock::time_point start = Clock::now() + 1h;
};

void refuse(RefusalReport& report, Clock::time_point now, int port,
            std::string_view kind = kRefusedNotAPeer) {
  const std::string from = "10.0.0.9:" + std::to_string(port);
  report.refused(kind, from, "refused: " + std::string(kind), "closing the connection from " + from,
                 now);
}

TEST(RefusalReport, AQuietListenerLogsEachRefusalWithItsAddress) {
  Fixture f;
  {
    RefusalReport report("store 10.0.0.1:29500", f.log);
    for (int i = 0; i < 3; ++i)
      refuse(report, f.start + i * 1ms, 40000 + i);
    EXPECT_EQ(report.total(), 3u);
    EXPECT_FALSE(report.summaryDue());
  }
  const auto lines = f.sink->lines();
  ASSERT_EQ(lines.size(), 3u);
  EXPECT_EQ(lines[2], "store 10.0.0.1:29500: closing the connection from 10.0.0.9:40002");
}

TEST(RefusalReport, AFloodLogsItsBurstThenOneLineATokenAndCountsEveryConnection) {
  Fixture f;
  const RefusalReport::Limits limits{10, 5000ms};
  // 479069 connections in 15 s, as the flood that filled 85 MB of log.
  constexpr int kConnections = 479069;
  const auto span = 15s;
  RefusalReport report("store", f.log, limits);
  Clock::time_point now = f.start;
  for (int i = 0; i < kConnections; ++i) {
    now = f.start + std::chrono::duration_cast<Clock::duration>(span * i / double(kConnections));
    refuse(report, now, i % 60000, i % 100 == 0 ? kRefusedNoHandshake : kRefusedNotAPeer);
    // The owner's timer, as AcceptGate sets it.
    if (auto due = report.summaryDue(); due && *due <= now) report.flush(now);
  }
  report.flush(now);
  EXPECT_EQ(report.total(), static_cast<std::uint64_t>(kConnections));
  const auto counted = testing::countRefusals(f.sink->lines(), "closing the connection from");
  EXPECT_EQ(counted.connections, static_cast<std::uint64_t>(kConnections));
  // burst + span / every, and the summary at the end.
  EXPECT_LE(counted.lines, 10u + 3u + 1u);
  EXPECT_GE(counted.summaries.size(), 3u) << "a summary every 5 s while it lasts";
}

TEST(RefusalReport, TheSummaryNamesTheCountsByKindAndTheLastCulprit) {
  Fixture f;
  RefusalReport report("tcp store server 10.0.0.1:29500", f.log, {2, 5000ms});
  for (int i = 0; i < 2; ++i)
    refuse(report, f.start, 1000 + i);
  for (int i = 0; i < 5; ++i)
    refuse(report, f.start + 1s, 2000 + i, kRefusedNotAPeer);
  refuse(report, f.start + 2s, 3000, kRefusedNoHandshake);
  report.flush(f.start + 3500ms);
  const auto lines = f.sink->lines();
  ASSERT_EQ(lines.size(), 3u);
  EXPECT_EQ(lines[2],
            "tcp store server 10.0.0.1:29500: 6 more connections refused in the last 2.5 s (5 not "
            "a troupe peer, 1 no handshake in time); the last from 10.0.0.9:3000: refused: no "
            "handshake in time");
}

TEST(RefusalReport, ASummaryIsDueOnceATokenIsBackAndGoesOutWithTheNextRefusalThen) {
  Fixture f;
  RefusalReport report("store", f.log, {1, 1000ms});
  refuse(report, f.start, 1);          // the one token
  refuse(report, f.start + 100ms, 2);  // counted, waits for a token
  const auto due = report.summaryDue();
  ASSERT_TRUE(due);
  EXPECT_GE(*due, f.start + 999ms);  // (a double's rounding either side)
  EXPECT_LE(*due, f.start + 1001ms);
  refuse(report, f.start + 1200ms, 3);  // a token is back: the summary goes now, with this one
  EXPECT_FALSE(report.summaryDue());
  const auto lines = f.sink->lines();
  ASSERT_EQ(lines.size(), 2u);
  EXPECT_NE(lines[1].find("2 more connections refused in the last 1.1 s"), std::string::npos)
      << lines[1];
}

}  // namespace
}  // namespace troupe::transport
