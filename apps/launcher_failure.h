// The launcher's failure policy (apps/launcher*.cc only; see launcher.h): which failure of a
// world it names, and how, including the peer a failing process blames on a culprit line.
//
// A process of a run that fails because of another process of the run (a peer that hung or is
// gone) prints one line on stderr before exiting non-zero:
//   troupe-culprit: <role> <rank>: <reason>
// e.g. "troupe-culprit: server 0: no pull answer for step 12 within 60 s (peer_timeout)". The
// launcher relays the line like any other and, when that process is the failure it names, names
// the culprit first: "server 0 on HOST (pid P) is hung or gone: REASON; reported by worker 0,
// which exited with code 1". The exit code stays the failing process's.
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>

#include "apps/launcher_process.h"

namespace troupe::apps::launch_detail {

// How a process ended, as the launcher reports it.
struct Outcome {
  bool ok = true;
  int code = 0;  // the launcher's exit code when this one is the failure
  bool by_signal = false;
  std::string what;  // "exited with code 3"
};

// How one start of the whole world ended.
struct Attempt {
  int code = 0;              // 0: every process exited 0
  std::string failure;       // who failed and how: "worker 1 on localhost exited with code 3"
  bool interrupted = false;  // the launcher got SIGINT, SIGTERM or SIGHUP: never restarted
  // torchrun's elastic model (AgentPlace): every process was stopped for `failure`, a change of
  // the run's members, not a failure of one of them.
  bool changed = false;
  int failed_rank = -1;    // the worker named by `failure`; -1: none (a server, or no failure)
  bool by_signal = false;  // that worker was killed by a signal
};

// A peer named on a culprit line.
struct Culprit {
  std::string role;
  int rank = 0;
  std::string reason;
};

// The culprit named on `line` (anywhere in it), if it holds a well-formed culprit line.
std::optional<Culprit> parseCulprit(std::string_view line);

// Picks the failure of a world to name. The first failure opens a short window before the others
// are stopped: a process that loses a peer may exit before the peer's own death is reaped, so
// within the window one killed by a signal is the likelier cause (the others exit because they
// lost it), then the one that failed first.
class FailurePicker {
 public:
  // A process (its index) ended with `outcome`; ignored once a failure is picked or if it is ok.
  void ended(std::size_t who, const Outcome& outcome);
  // The failure to name, once, when it is time: a signal death at once, else when the window is
  // over or `all_done`.
  std::optional<std::size_t> pick(bool all_done);
  bool picked() const { return picked_; }
  const Outcome& outcome() const { return outcome_; }

 private:
  std::optional<std::size_t> candidate_;
  Outcome outcome_;
  Clock::time_point settle_until_{};
  bool picked_ = false;
};

// The message of a troupe process's error line ("[2026-11-25 06:56:04.921] [error] MESSAGE"), if
// `line` is one. The first one a process logs is the likeliest cause of its exit.
std::optional<std::string> parseErrorLine(std::string_view line);

// A process of the run as a failure summary names it.
struct Named {
  std::string label;  // "server 0"
  std::string host;
  std::string pid;  // "pid 12", "remote pid 34"; empty: not known
};

// "server 0 on HOST (pid P) STATE: REASON; reported by worker 0[ on HOST2], which WHAT", where
// STATE is "is stopped (SIGSTOP or a stopped terminal)" when `stopped`, "is gone: it WHAT2" when
// `culprit_ended` holds how it ended, else "is hung or gone". `culprit` null: the named process
// is not one of the run's.
std::string blame(const Culprit& line, const Named* culprit, bool stopped,
                  const std::optional<std::string>& culprit_ended, const Named& reporter,
                  std::string_view reporter_what);

// A process that failed on its own, with the first error it logged: "worker 1 on HOST (pid P)
// WHAT: ERROR". When another process's culprit line blamed it (`line`, `reporter`), the others'
// side follows: "; server 0 lost it (REASON) and exited with code 1".
std::string ownFailure(const Named& who, std::string_view what, std::string_view error,
                       const Culprit* line = nullptr, const Named* reporter = nullptr,
                       std::string_view reporter_what = {});

}  // namespace troupe::apps::launch_detail
