// How a listener (transport links, the embedded store) tells of the connections it refuses
// without letting a flood of them flood its log. Every refusal is counted. Lines come from a token
// bucket: a quiet listener logs its first `burst` refusals one by one, then one line per `every`;
// a refusal that finds no token is counted by kind, and the counts go out in one summary line as
// soon as a token is back:
//   "tcp store server 10.0.0.1:29500: 479059 more connections refused in the last 15.0 s
//    (479000 not a troupe peer, 59 no handshake in time); the last from 10.0.0.9:51234: ..."
// So a listener logs at most burst + T/every lines in T, and one more when it closes, whatever
// comes at it.
// Threads: not thread-safe; its owner calls it on one thread or strand (AcceptGate: on its own).
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

namespace spdlog {
class logger;
}

namespace troupe::transport {

// Kinds of refusal, the categories a summary counts.
inline constexpr std::string_view kRefusedNotAPeer = "not a troupe peer";
inline constexpr std::string_view kRefusedAuthentication = "authentication failed";
inline constexpr std::string_view kRefusedNoHandshake = "no handshake in time";
inline constexpr std::string_view kRefusedClosedEarly = "closed during the handshake";
inline constexpr std::string_view kRefusedAnotherUser = "another user";
inline constexpr std::string_view kRefusedAnotherRun = "another run";
inline constexpr std::string_view kRefusedNoHello = "no valid Hello";
inline constexpr std::string_view kRefusedBadRequest = "bad request";

struct RefusalLimits {
  int burst = 10;                         // lines a quiet listener logs one by one
  std::chrono::milliseconds every{5000};  // one line more (a refusal or a summary) per this
};

class RefusalReport {
 public:
  using Clock = std::chrono::steady_clock;
  using Limits = RefusalLimits;

  // `listener` starts every line ("tcp store server 10.0.0.1:29500"); null `log`: spdlog's
  // default logger.
  RefusalReport(std::string listener, std::shared_ptr<spdlog::logger> log, Limits limits = {});
  // Logs the summary still pending, if any.
  ~RefusalReport();
  RefusalReport(const RefusalReport&) = delete;
  RefusalReport& operator=(const RefusalReport&) = delete;

  // One refused connection: `kind` one of the kinds above, `from` its remote address, `why` the
  // full reason, `line` what the listener says of it, logged at error after its name while tokens
  // last (it names `from` and `why` itself).
  void refused(std::string_view kind, std::string_view from, std::string_view why,
               std::string_view line, Clock::time_point now = Clock::now());
  // When the summary of the refusals not logged is due (once a token is back); nullopt: none is
  // pending.
  std::optional<Clock::time_point> summaryDue() const;
  // Logs the pending summary now, token or not (for a timer at summaryDue(), or at the end).
  void flush(Clock::time_point now = Clock::now());

  // Refusals so far, logged or not.
  std::uint64_t total() const { return total_; }

 private:
  void refill(Clock::time_point now);
  void summarise(Clock::time_point now);

  const std::string listener_;
  const std::shared_ptr<spdlog::logger> log_;
  const Limits limits_;
  double tokens_;
  Clock::time_point refilled_;
  std::uint64_t total_ = 0;
  // The refusals not logged yet.
  std::uint64_t pending_ = 0;
  Clock::time_point firstPending_{};
  std::map<std::string, std::uint64_t, std::less<>> pendingByKind_;
  std::string lastFrom_, lastWhy_;
};

}  // namespace troupe::transport
