// Loading configs in tests (actors/config/train_config.h).
#pragma once

#include <string>

#include "actors/config/train_config.h"
#include "troupe/error.h"

namespace troupe::testing {

// The InputError loadTrainOptions throws for `file` and `overrides`, as text; "" if none.
inline std::string configErrorOf(const std::string& file,
                                 const actors::ConfigOverrides& overrides = {}) {
  try {
    actors::loadTrainOptions(file, overrides);
  } catch (const InputError& e) {
    return e.what();
  }
  return "";
}

}  // namespace troupe::testing
