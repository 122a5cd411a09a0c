// The model of a run's config, to score weights on data of one's own: what an evaluator service
// does with the weights an Observer (troupe/observer.h) gets, or with a checkpoint's.
//
//   auto model = troupe::Model::create("configs/lenet.toml");
//   auto score = model.value()->evaluate(weights, "/data/fashion-mnist-lmdb/test");
//   if (score) publish(score->accuracy);
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>

#include "troupe/settings.h"
#include "troupe/status.h"

namespace troupe {

// A language model's (block_size) loss and accuracy are per token, its records its sequences.
struct Score {
  double loss = 0;         // mean cross-entropy
  double accuracy = 0;     // top-1
  std::int64_t count = 0;  // records scored
};

// Config keys of `troupe train` over the config file's (model or [[layers]], db_type,
// image_size, num_channels, num_labels, scale, mean, batch_size, threads ...).
using ModelSettings = Settings;

class Model {
 public:
  // The config's model, with its input shape and preprocessing; kInput naming the culprit for a
  // bad config (as `troupe train` would).
  static Result<std::unique_ptr<Model>> create(const std::string& config_file,
                                               const ModelSettings& settings = {});
  virtual ~Model() = default;

  // Trainable values, the length of the weights it scores.
  virtual std::int64_t numParams() const = 0;
  // Scores `weights` (numParams() values, laid out as Observer and checkpoints have them) on the
  // first `max_records` records (0: all) of the database at `data`, read as the config reads its
  // test data (db_type, image size, channels, scale, mean; a language model's token shards), in
  // batches of batch_size. kInput for weights of another length or a database that is missing or
  // of other images; kIo when it cannot be read.
  virtual Result<Score> evaluate(std::span<const float> weights, const std::string& data,
                                 std::int64_t max_records = 0) = 0;
};

}  // namespace troupe
