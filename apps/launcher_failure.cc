#include "apps/launcher_failure.h"

#include <fmt/format.h>

#include <cctype>

namespace troupe::apps::launch_detail {
namespace {

constexpr std::string_view kCulpritTag = "troupe-culprit: ";

// How long after a first failure the launcher waits for a process killed by a signal before it
// names the first failure and stops the others.
constexpr auto kSettle = std::chrono::milliseconds(500);

}  // namespace

std::optional<Culprit> parseCulprit(std::string_view line) {
  const auto at = line.find(kCulpritTag);
  if (at == std::string_view::npos) return std::nullopt;
  std::string_view rest = line.substr(at + kCulpritTag.size());
  const auto space = rest.find(' ');
  const auto colon = rest.find(": ");
  if (space == 0 || space == std::string_view::npos || colon == std::string_view::npos ||
      colon <= space + 1) {
    return std::nullopt;
  }
  const std::string_view role = rest.substr(0, space),
                         rank = rest.substr(space + 1, colon - space - 1);
  for (const char ch : role) {
    if (!std::isalpha(static_cast<unsigned char>(ch))) return std::nullopt;
  }
  if (rank.size() > 9 || rank.find_first_not_of("0123456789") != std::string_view::npos) {
    return std::nullopt;
  }
  Culprit c{std::string(role), std::stoi(std::string(rank)), std::string(rest.substr(colon + 2))};
  while (!c.reason.empty() && std::isspace(static_cast<unsigned char>(c.reason.back())))
    c.reason.pop_back();
  return c;
}

std::optional<std::string> parseErrorLine(std::string_view line) {
  constexpr std::string_view kTag = "] [error] ";
  const auto at = line.find(kTag);
  if (at == std::string_view::npos || line.front() != '[') return std::nullopt;
  std::string message(line.substr(at + kTag.size()));
  while (!message.empty() && std::isspace(static_cast<unsigned char>(message.back())))
    message.pop_back();
  if (message.empty()) return std::nullopt;
  return message;
}

void FailurePicker::ended(std::size_t who, const Outcome& outcome) {
  if (outcome.ok || picked_) return;
  if (!candidate_) settle_until_ = Clock::now() + kSettle;
  if (!candidate_ || (outcome.by_signal && !outcome_.by_signal)) {
    candidate_ = who;
    outcome_ = outcome;
  }
}

std::optional<std::size_t> FailurePicker::pick(bool all_done) {
  if (!candidate_ || picked_) return std::nullopt;
  if (!outcome_.by_signal && !all_done && Clock::now() < settle_until_) return std::nullopt;
  picked_ = true;
  return candidate_;
}

std::string blame(const Culprit& line, const Named* culprit, bool stopped,
                  const std::optional<std::string>& culprit_ended, const Named& reporter,
                  std::string_view reporter_what) {
  std::string who;
  if (culprit == nullptr) {
    who = fmt::format("{} {} (not a process of this run)", line.role, line.rank);
  } else {
    who = fmt::format("{} on {}{}", culprit->label, culprit->host,
                      culprit->pid.empty() ? "" : fmt::format(" ({})", culprit->pid));
  }
  const std::string state = stopped         ? "is stopped (SIGSTOP or a stopped terminal)"
                            : culprit_ended ? "is gone: it " + *culprit_ended
                                            : "is hung or gone";
  const bool same_host = culprit != nullptr && culprit->host == reporter.host;
  return fmt::format("{} {}: {}; reported by {}{}, which {}", who, state, line.reason,
                     reporter.label, same_host ? "" : " on " + reporter.host, reporter_what);
}

std::string ownFailure(const Named& who, std::string_view what, std::string_view error,
                       const Culprit* line, const Named* reporter, std::string_view reporter_what) {
  std::string text = fmt::format("{} on {}{} {}: {}", who.label, who.host,
                                 who.pid.empty() ? "" : fmt::format(" ({})", who.pid), what, error);
  if (line != nullptr && reporter != nullptr) {
    text += fmt::format("; {}{} lost it ({}) and {}", reporter->label,
                        reporter->host == who.host ? "" : " on " + reporter->host, line->reason,
                        reporter_what);
  }
  return text;
}

}  // namespace troupe::apps::launch_detail
