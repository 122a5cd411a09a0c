#include "actors/config/worker_bounds.h"

#include <fmt/format.h>

#include <charconv>

#include "troupe/error.h"

namespace troupe::actors {
namespace {

int parseInt(std::string_view text, std::string_view whole) {
  int value = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc() || end != text.data() + text.size()) {
    throw InputError(fmt::format(
        "num_workers '{}': expected a number of workers N, or MIN:MAX for an elastic run", whole));
  }
  return value;
}

}  // namespace

WorkerBounds parseNumWorkers(std::string_view text) {
  WorkerBounds b;
  const auto colon = text.find(':');
  if (colon == std::string_view::npos) {
    b.fixed = parseInt(text, text);
    if (b.fixed < 1) throw InputError(fmt::format("num_workers {}: need at least 1", text));
    return b;
  }
  b.min = parseInt(text.substr(0, colon), text);
  b.max = parseInt(text.substr(colon + 1), text);
  if (b.min < 1) throw InputError(fmt::format("num_workers {}: MIN must be at least 1", text));
  if (b.min > b.max) {
    throw InputError(fmt::format("num_workers {}: MIN {} is more than MAX {}", text, b.min, b.max));
  }
  return b;
}

}  // namespace troupe::actors
