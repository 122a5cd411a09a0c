// A run's id: what it may hold, and the id each generation of a restarted run meets under.
// Header-only, so that the config check needs nothing else. (Nothing on disk is named after it:
// links use abstract Unix sockets with random names, transport/link.h.)
#pragma once

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <string>

#include "troupe/error.h"

namespace troupe::actors {

// Throws InputError unless `run_id` is made of letters, digits, '.', '_' and '-': it names files
// and folders, and a '/' in it would reach outside them.
inline void checkRunId(const std::string& run_id) {
  const bool ok = !run_id.empty() && std::all_of(run_id.begin(), run_id.end(), [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '_' || c == '-';
  });
  if (!ok) {
    throw InputError(fmt::format(
        "run_id '{}' may hold letters, digits, '.', '_' and '-' only, and not be empty", run_id));
  }
}

// The run id that generation `generation` of a restarted run meets under: the run id itself for
// the first, RUN-genK after it, so that each generation meets apart from the ones before it.
inline std::string generationRunId(const std::string& run_id, int generation) {
  return generation > 0 ? fmt::format("{}-gen{}", run_id, generation) : run_id;
}

}  // namespace troupe::actors
