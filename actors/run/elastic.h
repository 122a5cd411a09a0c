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
// A round: each worker adds itself to the round's count, writes its record (rank in its last
// generation, the step its state is at, a name) and, while it waits, beats (adds to a counter of
// its own every 200 ms). A member is alive to another while its beat moved in the last 2 s, and
// a round closes only while every live member's beat moved in the last 0.6 s. Only
// members of the run close a round: workers of a generation of it (old rank >= 0), or anyone
// before the run's first generation formed; a newcomer to a formed run only waits to be admitted,
// so a joiner killed or stopped at any moment, or a store client that writes a member record and
// never acts, holds up no one. Once MAX live members are in, or MIN and the live ones unchanged
// for a last call of 1 s, the first eligible waiter to claim the round's close writes the indices
// it admits: live ones, members of the run first, at most MAX. Workers left out go on to the next
// round. Ranks follow the old ranks, newcomers last (those troupe launch started in the order of
// its ranks, then the others in order of coming).
//
// Before a worker first counts in any round, its run print (the options every worker must share
// whatever the world's size) is checked against the run's, set by the first worker that came: a
// worker that disagrees is refused before anyone waits for it.
//
// Known limit: a closer stopped (SIGSTOP) between its claim of a round's close and its write of
// the admitted list holds up the round's others until their timeout. Lifting it needs a
// compare-and-set in the Store (an expiring claim).
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "actors/config/worker_bounds.h"
#include "actors/roles/roles.h"
#include "actors/run/run_plan.h"

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

// The options every worker of an elastic run must share whatever the world's size, as name and
// value pairs ("num_epochs", "4"): the run's agreed keys and what follows from them and the data
// (trainer.cc's elasticRunPrint; run_plan.h's PlanValues).
using RunPrint = PlanValues;

// Every method may be called from any thread; joinerWaiting is the one a running generation
// calls (its coordinator's thread) while join is not running.
class ElasticRendezvous {
 public:
  // `store` holds the run's keys (prefixed with its run id); `timeout` bounds each wait.
  ElasticRendezvous(std::shared_ptr<rendezvous::Store> store, WorkerBounds bounds,
                    std::chrono::milliseconds timeout);

  // Checks `print` against the run's before this worker counts in any round; the first worker
  // to come sets the run's. False: the run is over already. InputError naming run `run_id` and
  // what differs ("num_epochs: the run has 4, this one 5"); TimeoutError when the worker that
  // claimed the run's print never wrote it.
  bool agreeOnRun(const std::string& run_id, const RunPrint& print);
  // Meets the others in the next round that forms with this worker in it. TimeoutError when
  // fewer than MIN come within the timeout, naming the round and who came; for a newcomer to a
  // formed run, when no worker of the run came to admit it.
  Generation join(const Member& me);
  // Whether a worker waits, alive, to join the round after `round` while the generation has room
  // (fewer than MAX): some member of that round whose beat moved since the last call (the first
  // call only looks). A record with no beat, or a beat that stopped, is no one waiting.
  bool joinerWaiting(int round, int world);
  // The run is over: workers that wait to join are told so.
  void finishRun();

 private:
  // The indices admitted to the round, once closed; nullopt: the run is over.
  std::optional<std::vector<int>> awaitClose(int round, int index, bool may_close);
  std::vector<int> admit(int round, const std::vector<int>& live);
  [[noreturn]] void throwTimeout(int round, bool may_close, const std::vector<int>& live);
  std::int64_t beatOf(int round, int index);  // 0: none yet (InputError: not a counter)

  std::shared_ptr<rendezvous::Store> store_;
  WorkerBounds bounds_;
  std::chrono::milliseconds timeout_;
  std::mutex mutex_;                  // guards seen_round_ and seen_
  int seen_round_ = -1;               // the round whose beats seen_ holds (joinerWaiting's)
  std::map<int, std::int64_t> seen_;  // by index: its beat at the last look
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
// last step (runTraining calls it when num_workers is MIN:MAX). `print` is this worker's run
// print, from its own full check of the options, the data and the model; `train` runs one
// generation.
TrainResult runElastic(
    const TrainOptions& options, const RunPrint& print,
    const std::function<TrainResult(const TrainOptions&, GenerationRole&)>& train);

}  // namespace troupe::actors
