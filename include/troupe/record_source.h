// Training data of one's own in place of a database: a service's records in memory (or anywhere
// it can read them from), fed to troupe's Reader actors, which read them as they read a database:
// the epoch's shuffled order, each replica's share, batches prefetched ahead of the replicas.
//
//   struct MyRecords : troupe::RecordSource { ... };
//   auto trainer = troupe::Trainer::start("configs/mlp.toml", {{"num_epochs", "2"}}, {},
//                                         {.train = std::make_shared<MyRecords>(train_part),
//                                          .test = std::make_shared<MyRecords>(test_part)});
#pragma once

#include <cstdint>
#include <span>

#include "troupe/status.h"

namespace troupe {

class RecordSource {
 public:
  virtual ~RecordSource() = default;
  // Records of an epoch, read by index in [0, size()).
  virtual std::int64_t size() const = 0;
  // Writes record `index`'s image into `image` (channels x height x width floats of the run's
  // config, as the model takes them: the config's scale and mean are not applied) and
  // returns its label, in [0, num_labels). Called from several readers' threads at once. An
  // error (or a label out of range) ends the run, naming the record (or, with
  // skip_bad_records, leaves the record out and counts it).
  virtual Result<int> read(std::int64_t index, std::span<float> image) const = 0;
};

}  // namespace troupe
