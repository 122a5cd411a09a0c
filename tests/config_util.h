// Configs in tests: TrainOptions made by hand (actors/run/trainer.h) or loaded
// (actors/config/train_config.h).
#pragma once

#include <string>

#include "actors/config/train_config.h"
#include "actors/run/trainer.h"
#include "cli_util.h"
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

// Options that train `model` on the converted Fashion-MNIST training set (testData("lmdb")),
// logging to `log_dir` without per-step lines; every other setting at its default.
inline actors::TrainOptions fashionMnistOptions(const std::string& model,
                                                const std::string& log_dir) {
  actors::TrainOptions o;
  o.model.name = model;
  o.train_data = testData("lmdb") + "/train";
  o.db_type = data::DbType::kLmdb;
  o.log_dir = log_dir;
  o.log_every = 0;
  return o;
}

}  // namespace troupe::testing
