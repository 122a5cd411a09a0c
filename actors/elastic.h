// Elastic worlds: `num_workers = "MIN:MAX"` (torchrun's --nnodes MIN:MAX). The workers of a run
// meet in rounds of a rendezvous on the run's store; each round that forms is a generation of
// MIN to MAX workers with ranks 0..W-1, a transport and store keys of its own. When a worker of a
// generation dies (its links drop, or it stops answering within peer_timeout) the others leave
// the generation at once; when a worker waits to join, every worker pauses between two steps
// (PauseAt). Either way they meet in the next round and go on from the newest state one of them
// holds in memory, handed to the others over the new generation's links (Handover): no disk.
// The epoch's remaining records are cut anew into steps of the new global batch (StepPlan::
// startAt), so none is trained twice or left out (but the tail shorter than a global batch,
// which every epoch leaves out).
//
// A round: each worker adds itself to the round's count and writes its record (rank in its last
// generation, the step its state is at, a name). The first to come leads: once MIN are in, it
// waits until MAX are or none came for kLastCall, and closes the round with the count. Workers
// that came after the close go on to the next round. Ranks follow the old ranks, newcomers last
// (those troupe launch started in the order of its ranks, then the others in order of coming).
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "actors/roles.h"
#include "actors/worker_bounds.h"

namespace troupe::rendezvous {
class Store;
}

namespace troupe::actors {

class TrainLog;

// A worker's record in a round.
struct Member {
  std::string name;        // host:pid
  int old_rank = -1;       // in its last generation; -1: none (new)
  int launch_rank = -1;    // TROUPE_RANK from troupe launch, ordering the first generation
  std::int64_t step = -1;  // of the state it holds; -1: none
  std::int64_t epoch = 0;
  std::int64_t epoch_records = 0;
};

struct Generation {
  int round = 0;
  int rank = 0;
  std::vector<Member> members;  // by rank
  int source = 0;               // the rank whose state the generation goes on from
  bool run_over = false;        // the run ended while this worker waited to join
  int world() const { return static_cast<int>(members.size()); }
};

class ElasticRendezvous {
 public:
  // `store` holds the run's keys (prefixed with its run id); `timeout` bounds each wait.
  ElasticRendezvous(std::shared_ptr<rendezvous::Store> store, WorkerBounds bounds,
                    std::chrono::milliseconds timeout);

  // Meets the others in the next round that forms with this worker in it. TimeoutError when
  // fewer than MIN come within the timeout, naming the round and who came.
  Generation join(const Member& me);
  // Whether a worker waits to join the round after `round` while it has room (fewer than MAX).
  bool joinerWaiting(int round, int world);
  // The run is over: workers that wait to join are told so.
  void finishRun();

 private:
  int lead(int round);        // the round's size; -1: the run is over
  int waitClosed(int round);  // the round's size; -1: the run is over

  std::shared_ptr<rendezvous::Store> store_;
  WorkerBounds bounds_;
  std::chrono::milliseconds timeout_;
};

// What trainer.cc's one-generation run takes from the elastic loop.
struct GenerationRole {
  std::string run_id;                 // of the generation's transport and store keys
  TrainState start;                   // the position it starts at (no tensors)
  std::shared_ptr<TrainState> state;  // in: this process's state; out: where it stands after
  bool await_handover = false;
  std::vector<int> handover_to;  // ranks
  std::function<bool()> joiner_waiting;
  std::shared_ptr<EpochCarry> carry;
  std::unique_ptr<TrainLog>* log = nullptr;  // the chief's log, kept from generation to generation
  std::int64_t last_step = 0;  // out: the run's last step, as the generation planned it
};

// The elastic loop of one worker process: joins rounds and trains generations until the run's
// last step (runTraining calls it when num_workers is MIN:MAX). `train` runs one generation.
TrainResult runElastic(
    const TrainOptions& options,
    const std::function<TrainResult(const TrainOptions&, GenerationRole&)>& train);

}  // namespace troupe::actors
