#include "transport/refusal_report.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <utility>
#include <vector>

namespace troupe::transport {

RefusalReport::RefusalReport(std::string listener, std::shared_ptr<spdlog::logger> log,
                             Limits limits)
    : listener_(std::move(listener)),
      log_(log ? std::move(log) : spdlog::default_logger()),
      limits_{std::max(1, limits.burst), std::max(std::chrono::milliseconds(1), limits.every)},
      tokens_(limits_.burst),
      refilled_(Clock::now()) {}

RefusalReport::~RefusalReport() {
  flush();
}

void RefusalReport::refill(Clock::time_point now) {
  if (now <= refilled_) return;
  const double earned =
      std::chrono::duration<double>(now - refilled_) / std::chrono::duration<double>(limits_.every);
  tokens_ = std::min<double>(limits_.burst, tokens_ + earned);
  refilled_ = now;
}

void RefusalReport::refused(std::string_view kind, std::string_view from, std::string_view why,
                            std::string_view line, Clock::time_point now) {
  refill(now);
  ++total_;
  // Refusals already waiting for a summary go first: the lines keep the order of events.
  if (pending_ == 0 && tokens_ >= 1) {
    tokens_ -= 1;
    log_->error("{}: {}", listener_, line);
    return;
  }
  if (pending_ == 0) firstPending_ = now;
  ++pending_;
  if (auto it = pendingByKind_.find(kind); it != pendingByKind_.end()) {
    ++it->second;
  } else {
    pendingByKind_.emplace(std::string(kind), 1);
  }
  lastFrom_ = from;
  lastWhy_ = why;
  if (tokens_ >= 1) {
    tokens_ -= 1;
    summarise(now);
  }
}

std::optional<RefusalReport::Clock::time_point> RefusalReport::summaryDue() const {
  if (pending_ == 0) return std::nullopt;
  if (tokens_ >= 1) return refilled_;
  return refilled_ + std::chrono::ceil<Clock::duration>((1 - tokens_) * limits_.every);
}

void RefusalReport::flush(Clock::time_point now) {
  if (pending_ == 0) return;
  refill(now);
  tokens_ = std::max(0.0, tokens_ - 1);
  summarise(now);
}

void RefusalReport::summarise(Clock::time_point now) {
  std::vector<std::pair<std::uint64_t, std::string_view>> kinds;
  for (const auto& [kind, count] : pendingByKind_)
    kinds.emplace_back(count, kind);
  std::stable_sort(kinds.begin(), kinds.end(),
                   [](const auto& a, const auto& b) { return a.first > b.first; });
  std::string counts;
  for (const auto& [count, kind] : kinds)
    counts += fmt::format("{}{} {}", counts.empty() ? "" : ", ", count, kind);
  const double seconds = std::chrono::duration<double>(now - firstPending_).count();
  log_->error("{}: {} more connection{} refused in the last {:.1f} s ({}); the last from {}: {}",
              listener_, pending_, pending_ == 1 ? "" : "s", std::max(0.0, seconds), counts,
              lastFrom_, lastWhy_);
  pending_ = 0;
  pendingByKind_.clear();
}

}  // namespace troupe::transport
