// Watching a running training from another process. An Observer joins a run of `troupe train`
// (any launcher and schedule; not elastic) as an extra member that only listens: the chief sends
// it the weights after every N-th step and after the last one. An evaluator service scores them
// on data of its own (troupe/model.h); a dashboard plots them. The run goes on whether observers
// come, leave or hang; nothing an observer does can stop it.
//
//   auto watching = troupe::Observer::join(
//       {{"rendezvous", "tcp://10.0.0.1:29500"}, {"run_id", "r1"}, {"secret_file", "secret"}},
//       100, [](const troupe::ObservedWeights& w) { score(w.step, w.weights); });
//   if (!watching) return fail(watching.status().message());
//   watching.value()->wait(std::chrono::hours(2));   // until the run's last step came
//
// The run must have a rendezvous (a multi-process run: troupe launch, or --rendezvous by hand);
// the observer needs the run's id and secret, as its workers do. Weights only: a model with
// batch norm has its running statistics on the replicas, not in what observers get.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <span>
#include <string>

#include "troupe/settings.h"
#include "troupe/status.h"

namespace troupe {

struct ObservedWeights {
  std::int64_t step = 0;             // the weights after this many steps of the run
  std::int64_t steps_per_epoch = 0;  // the run's
  std::int64_t last_step = 0;        // the run's
  std::span<const float> weights;    // flat, as the run's checkpoints hold them; valid in the call
};

// Config keys of `troupe train` that find the run: rendezvous, run_id, secret_file, interface,
// rendezvous_timeout, peer_timeout (over TROUPE_* variables, as for any process of the run).
using ObserverSettings = Settings;

class Observer {
 public:
  // Joins the run (waiting up to rendezvous_timeout for its chief to be up) and asks for the
  // weights after every `every_steps`-th step; `on_weights` is called for each, on the
  // observer's own thread, one call at a time.
  static Result<std::unique_ptr<Observer>> join(
      const ObserverSettings& settings, std::int64_t every_steps,
      std::function<void(const ObservedWeights&)> on_weights);
  // Leaves the run; the run goes on.
  virtual ~Observer() = default;

  // Waits until the weights of the run's last step came (ok), the chief's link was lost before
  // them (kPeer: the run failed or stopped early), or `timeout` ran out (kTimeout).
  virtual Status wait(std::chrono::milliseconds timeout) = 0;
  // The step of the newest weights received; -1 before the first.
  virtual std::int64_t newestStep() const = 0;
};

}  // namespace troupe
