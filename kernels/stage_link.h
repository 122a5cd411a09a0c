// The link between pipeline stages in different processes (PipelineOptions::link, kernels/net.h):
// what they send each other, and how a net's stage meets the runtime that carries it.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <mutex>
#include <string>
#include <vector>

#include "kernels/tensor.h"

namespace troupe::kernels {

// What pipeline stages in different processes send each other: one micro-batch's activations,
// forward to the next stage, or their gradient, back to the stage before; and once a step, for
// the weights of one stage that a layer of another reads (tied weights: GPT-2's output layer reads
// the embedding's wte), the reader's part of their gradient to the owner, and their values to the
// reader (micro-batch 0, the ranges one after another).
struct StageTensor {
  enum Kind : std::uint8_t { kActivations, kGradients, kTiedGradients, kTiedWeights };
  std::int64_t step = 0;  // the sender's training steps so far, this one counted
  std::int32_t micro_batch = 0;
  std::int32_t from = 0;  // the sending stage
  Kind kind = kActivations;
  Tensor values;  // host float32, flat: the micro-batch's rows of the cut's shape
};

inline const char* kindName(StageTensor::Kind kind) {
  switch (kind) {
    case StageTensor::kActivations:
      return "activations";
    case StageTensor::kGradients:
      return "gradients";
    case StageTensor::kTiedGradients:
      return "tied weights' gradients";
    case StageTensor::kTiedWeights:
      return "tied weights";
  }
  return "stage tensor of no kind";
}

// A stage's time over some training steps (Net::stageTimes).
struct StageTimes {
  double pipelined = 0;  // seconds from each step's start here to its last backward here
  double busy = 0;       // seconds of those computing (waits for other stages left out)
  std::int64_t steps = 0;
};

// The link between a net's pipeline stage and those of the other processes. The runtime sends
// (send(), from the net's stage thread) and hands what arrives to deliver(); the net takes it by
// receiveBy(). A message that comes before the net takes any is kept for it.
class StageLink {
 public:
  virtual ~StageLink() = default;
  // Carries `message` to stage `to`'s process. Any thread; blocks only while that link is full.
  virtual void send(int to, StageTensor message) = 0;
  // Who runs stage `stage`, for errors ("worker 3").
  virtual std::string nameOf(int stage) const = 0;
  // How long a stage waits for another's message before the run fails naming that one.
  virtual std::chrono::milliseconds timeout() const = 0;
  // How long it waits before it reports the stall (once a wait, where that is before timeout()),
  // and where the report goes (the run's log); by default no report.
  virtual std::chrono::milliseconds stallWarning() const { return timeout(); }
  virtual void warn(const std::string& /*report*/) {}

  // Any thread. The receiver may throw (a malformed message): the caller's handler then fails.
  void deliver(StageTensor message);
  void receiveBy(std::function<void(StageTensor)> receiver);
  // The run is failing: the net's waits end (Aborted); later deliveries are dropped.
  void abort();
  void onAbort(std::function<void()> hook);

 private:
  std::mutex mutex_;
  std::function<void(StageTensor)> receiver_;
  std::function<void()> abort_hook_;
  std::vector<StageTensor> early_;
  bool aborted_ = false;
};

}  // namespace troupe::kernels
