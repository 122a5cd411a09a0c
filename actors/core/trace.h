// A Chrome trace of a run (Trace Event Format JSON, for chrome://tracing and Perfetto): spans of
// forward, backward, reduce, allreduce, send, receive and update, per actor and per process, so
// anyone can see communication overlap the backward pass.
//
// Each process records its own spans; times are wall-clock microseconds, so the processes of one
// machine line up. Thread safety: every method may be called from any thread.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

namespace troupe::actors {

class Trace {
 public:
  using Clock = std::chrono::system_clock;

  // `process` names this process in the trace ("worker 0", "server 1"); `node` is its pid there.
  Trace(std::uint32_t node, std::string process);

  // A span on the track of `actor` (tracks may not overlap their own spans: nest or serialize).
  void span(std::string_view actor, std::string_view name, Clock::time_point begin,
            Clock::time_point end);
  // A span that may overlap others on its track (an allreduce of one bucket while another runs).
  void asyncSpan(std::string_view actor, std::string_view name, std::uint64_t id,
                 Clock::time_point begin, Clock::time_point end);

  // Writes {"traceEvents": [...]} to path (temp file + rename). Throws IoError naming it.
  void write(const std::string& path) const;
  // The events only, as a JSON array body (no brackets), for merging.
  std::string events() const;

  // `seconds` before `t`: where work a device timed by its own clock, ending `seconds` before a
  // point the host timed (a wait that returned), goes on the trace's clock.
  static Clock::time_point secondsBefore(Clock::time_point t, double seconds) {
    return t - std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds));
  }

  // Where process `node` of a multi-process run writes its part: "<path>.part<node>".
  static std::string partPath(const std::string& path, std::uint32_t node);
  // Joins the parts of nodes [0, nodes) into path and removes them. Throws IoError naming a part
  // that is missing.
  static void merge(const std::string& path, std::uint32_t nodes);

 private:
  int track(std::string_view actor);  // requires mu_

  std::uint32_t node_;
  std::string process_;
  mutable std::mutex mu_;
  std::map<std::string, int, std::less<>> tracks_;
  std::string body_;
};

// Records a span from construction to destruction; does nothing without a trace.
class TraceScope {
 public:
  TraceScope(Trace* trace, std::string_view actor, std::string_view name)
      : trace_(trace),
        actor_(actor),
        name_(name),
        begin_(trace ? Trace::Clock::now() : Trace::Clock::time_point{}) {}
  ~TraceScope() {
    if (trace_) trace_->span(actor_, name_, begin_, Trace::Clock::now());
  }
  TraceScope(const TraceScope&) = delete;
  TraceScope& operator=(const TraceScope&) = delete;

 private:
  Trace* trace_;
  std::string_view actor_, name_;
  Trace::Clock::time_point begin_;
};

}  // namespace troupe::actors
