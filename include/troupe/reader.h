// A Reader actor of one's own: it feeds one replica of a training run the batches of its steps,
// from wherever the service keeps its data, with its own sampling. troupe::Trainer spawns one per
// replica through TrainerData::reader (troupe/trainer.h), in place of the database readers.
//
//   class TableReader : public troupe::ReaderActor {
//    public:
//     TableReader(const troupe::ReaderSpec& spec, const Table& table)
//         : ReaderActor(spec), table_(table) {}
//    protected:
//     troupe::Status onCredit() override {
//       while (credit() > 0 && !finished()) {
//         table_.sample(nextStep(), images_, labels_);  // spec().batch inputs
//         if (auto sent = sendBatch(images_, labels_); !sent) return sent;
//       }
//       return {};
//     }
//   };
//   troupe::TrainerData data;
//   data.reader = [&](const troupe::ReaderSpec& s) { return std::make_unique<TableReader>(s, t); };
//
// The reader sends the batch of each step once, in step order; it may run `prefetch` batches
// ahead of its replica (credit). A batch of the wrong size, a label outside [0, num_labels) or a
// non-finite input is refused (an error value, nothing sent); an error returned from open() or
// onCredit() ends the run with it, naming the reader.
#pragma once

#include <chrono>
#include <cstdint>
#include <span>
#include <string>

#include "troupe/actor.h"
#include "troupe/status.h"

namespace troupe {

// A reader's place in the run and the batches it owes.
struct ReaderSpec {
  std::string name;    // "reader/W/R" (troupe/topology.h)
  int worker = 0;      // the process (its rank)
  int replica = 0;     // the replica it feeds, among the process's
  actors::Address to;  // that replica's address (Topology::replica(worker, replica))
  // The steps it feeds: [first_step, last_step); first_step > 0 when the run resumed.
  std::int64_t first_step = 0;
  std::int64_t last_step = 0;
  std::int64_t steps_per_epoch = 0;
  std::int64_t global_batch = 0;  // inputs a step, over every replica of every worker
  std::int64_t offset = 0;        // where this replica's inputs start within a step's
  std::int64_t batch = 0;         // inputs in each of its batches
  int channels = 1, height = 28, width = 28;
  int num_labels = 10;
  std::uint64_t seed = 1;  // the run's, for a sampling of one's own
  int prefetch = 4;        // batches it may send ahead of the replica
};

class ReaderActor : public actors::Actor {
 public:
  explicit ReaderActor(ReaderSpec spec);
  const ReaderSpec& spec() const { return spec_; }

 protected:
  // Once, before the first onCredit(): open what the reader reads.
  virtual Status open() { return {}; }
  // There is room for a batch: send one or more now (while credit() > 0), or later through
  // retryAfter() when the data is not there yet. Called at start and after each batch is used.
  virtual Status onCredit() = 0;

  std::int64_t nextStep() const { return next_; }  // the step the next batch is for
  std::int64_t epochOf(std::int64_t step) const { return step / spec_.steps_per_epoch; }
  int credit() const { return spec_.prefetch - in_flight_; }  // batches it may send now
  bool finished() const { return next_ >= spec_.last_step; }  // every batch sent

  // Sends nextStep()'s batch: spec().batch images of channels x height x width floats each
  // (NCHW, as the net takes them: any mean and scale applied) and as many labels.
  Status sendBatch(std::span<const float> images, std::span<const std::int32_t> labels);
  // Calls onCredit() again in `delay` (the data is on its way).
  void retryAfter(std::chrono::milliseconds delay);

 private:
  void started() final;
  void offer();
  ReaderSpec spec_;
  std::int64_t next_ = 0;
  int in_flight_ = 0;
  bool retry_pending_ = false;
};

}  // namespace troupe
