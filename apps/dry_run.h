// `troupe train --dry-run`: what a run of a config would start from, checked as runTraining
// checks it before its first step, without training.
#pragma once

#include <string>

#include "actors/config/train_config.h"

namespace troupe::apps {

// The report, in four parts: the resolved config as TOML (every key, each marked with where its
// value came from: the file, a flag, a TROUPE_* variable, the cluster engine or the default; a
// model of [[layers]] written out as such), the model's layers (output shape per sample,
// parameters, total), the data (the databases' record counts, the epoch) and the plan (workers,
// servers, schedule, batches, steps, learning rate at the first and last step, rendezvous).
//
// `options` is loadTrainOptions(file, overrides). Throws what a real run of it throws for the same
// mistake before any rendezvous: InputError for a bad value, a missing database or a checkpoint
// that does not fit, IoError for a log or checkpoint folder that cannot be written. Reads the
// config file, the environment, the databases and (to resume) checkpoints; writes nothing. Call it
// where no other thread changes the environment.
std::string dryRunReport(const std::string& file, const actors::ConfigOverrides& overrides,
                         const actors::TrainOptions& options);

}  // namespace troupe::apps
