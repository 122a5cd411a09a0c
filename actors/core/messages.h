// The messages of a training run. In-process they move as C++ values and tensors travel as
// handles (no copy); across processes each gets a Cap'n Proto schema in transport/.
//
// Ownership: a tensor in a message is lent, read-only, to its receiver unless the message says
// otherwise; each message that lends memory says until when. Memory a device may still be
// writing travels with the Event after which it is final (kernels/event.h): the receiver waits
// for it (Backend::waitFor, on its own device where it can) before it reads.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <string>

#include "actors/core/wire_form.h"
#include "kernels/event.h"
#include "kernels/optimizer.h"
#include "kernels/stage_link.h"
#include "kernels/tensor.h"

namespace troupe::actors {

using kernels::Tensor;

// Reader -> Replica: the replica's share of the global batch of one step, lent read-only until
// the replica's BatchConsumed for it (and its event).
struct Batch {
  std::int64_t step = 0;
  Tensor images;             // [n, C, H, W] float, host
  Tensor labels;             // [n] int32, host
  std::int64_t skipped = 0;  // bad records whose slots went to other records (skip_bad_records)
  double read_seconds = 0;   // the reader's time reading and decoding it
};

// Replica -> Reader: a batch was used; the reader may send one more (credit-based prefetch), and
// write the batch's memory again once `ready` is done (the replica's copy of it to its device).
struct BatchConsumed {
  std::int64_t step = 0;
  int replica = 0;  // the sender's index among its process's replicas (one reader may feed several)
  kernels::Event ready;
};

// Updater -> Replica: the weights that step `step` starts from. They stay the sender's memory:
// the replica may read them in place (or copy them to its device) until it has sent every
// GradBucket of the step, since the sender writes a range only once every replica handed in that
// range's gradients.
struct Weights {
  std::int64_t step = 0;
  Tensor weights;
  Tensor buffers;        // batch-norm statistics to adopt (a copy); undefined/empty: keep one's own
  kernels::Event ready;  // after the update that wrote `weights`
  // The replica multiplies the loss by this before its backward (mixed precision's loss scale,
  // UpdaterConfig::loss_scale), and the updater divides the reduced gradients by it.
  float loss_scale = 1.0f;
};
template <>
inline constexpr auto wire::kForm<Weights> = wire::form<Weights>(
    "weights", wire::field("step", &Weights::step), wire::field("weights", &Weights::weights),
    wire::field("buffers", &Weights::buffers), wire::field("lossScale", &Weights::loss_scale));

// An observer of a run (troupe/observer.h: a process that joined it to watch, such as an
// evaluator) -> the chief's updater or PS client: send the weights to actor `actor` of the
// observer's node after every `every`-th step and after the last one, as Weights.
struct Subscribe {
  std::uint32_t node = 0;  // the observer's
  std::uint32_t actor = 0;
  std::int64_t every = 1;
};
// Refuses a subscription from another node than its own, or to fewer than every step.
void checkDecoded(const Subscribe& s, std::uint32_t from_node);
template <>
inline constexpr auto wire::kForm<Subscribe> = wire::form<Subscribe>(
    "subscribe", wire::field("node", &Subscribe::node), wire::field("actor", &Subscribe::actor),
    wire::field("every", &Subscribe::every));

// Replica -> Reducer (or straight to the updater): gradients [begin, end) of the flat gradient
// tensor for one step, a slice of the replica's own gradients on its device. They are lent,
// writable: the reducer may sum the other replicas' into them. The replica writes them again only
// in its next backward, after the Weights of the next step, which the updater sends only once the
// reduced bucket is applied; whoever holds the bucket is done with it by then.
struct GradBucket {
  std::int64_t step = 0;
  int replica = 0;
  std::int64_t begin = 0;
  std::int64_t end = 0;
  Tensor grads;
  kernels::Event ready;  // after the backward work that wrote `grads`
};
template <>
inline constexpr auto wire::kForm<GradBucket> = wire::form<GradBucket>(
    "gradBucket", wire::field("step", &GradBucket::step),
    wire::field("replica", &GradBucket::replica), wire::field("begin", &GradBucket::begin),
    wire::field("end", &GradBucket::end), wire::field("grads", &GradBucket::grads));

// Reducer -> Updater: the sum over replicas (and processes) of one bucket, lent until the updater
// applied it: in one of the replicas' buckets, or in memory of the reducer's.
struct Reduced {
  std::int64_t step = 0;
  std::int64_t begin = 0;
  std::int64_t end = 0;
  Tensor grads;
  kernels::Event ready;  // after the work that wrote the sum
  // Where grads starts in the flat gradients; -1: at begin. ZeRO stage 2 sends its shard's part
  // of [begin, end) alone (empty where none of it is its shard's).
  std::int64_t grads_at = -1;
};
template <>
inline constexpr auto wire::kForm<Reduced> = wire::form<Reduced>(
    "reduced", wire::field("step", &Reduced::step), wire::field("begin", &Reduced::begin),
    wire::field("end", &Reduced::end), wire::field("grads", &Reduced::grads),
    wire::field("gradsAt", &Reduced::grads_at));

// Replica -> Coordinator: a step's training metrics.
struct StepDone {
  std::int64_t step = 0;
  int replica = 0;
  double loss_sum = 0;
  double correct = 0;
  std::int64_t count = 0;
  std::int64_t skipped = 0;  // bad records skipped in the step's batch
  // The input: how long the replica waited for the step's batch once it had the weights (0: the
  // batch was there), how many batches it held when the step began (the reader's queue, this
  // step's included) and the reader's time on the batch.
  double input_wait = 0;
  int ready = 0;
  double read_seconds = 0;
  // Bytes: the most this process held on the replica's device since its last StepDone, this
  // step's work (Backend::memory().device_peak, reset after each step; 0 on the CPU, whose memory
  // no backend counts).
  std::int64_t device_peak = 0;
};
template <>
inline constexpr auto wire::kForm<StepDone> = wire::form<StepDone>(
    "stepDone", wire::field("step", &StepDone::step), wire::field("replica", &StepDone::replica),
    wire::field("lossSum", &StepDone::loss_sum), wire::field("correct", &StepDone::correct),
    wire::field("count", &StepDone::count), wire::field("skipped", &StepDone::skipped),
    wire::field("inputWait", &StepDone::input_wait), wire::field("ready", &StepDone::ready),
    wire::field("readSeconds", &StepDone::read_seconds),
    wire::field("devicePeak", &StepDone::device_peak));

// Updater -> Coordinator: the last step of an epoch is applied. A paused updater (an evaluation
// or a checkpoint at this epoch's end, the run's end, a pause asked for: StepPlan::pausesAt) sends
// its weights and optimizer state and waits for Resume; one that went on sends neither.
struct EpochEnd {
  std::int64_t step = 0;  // steps applied so far
  Tensor weights;
  Tensor state;  // the optimizer's (kernels/optimizer.h: its rows one after another)
  // Mixed precision with a loss scale: the scale now, and the steps skipped so far because their
  // gradients held inf or NaN. loss_scale 0: no loss scale.
  float loss_scale = 0;
  std::int64_t overflow_steps = 0;
  bool paused = true;
  // Sharded optimizer state (ZeRO stage 1): the updater's shard is the rows' elements
  // [state_begin, state_end). The chief's `state` holds its shard; the others' none: the
  // coordinator asks each for its shard piece by piece (StateRequest) when it writes a
  // checkpoint. 0, 0: all.
  std::int64_t state_begin = 0;
  std::int64_t state_end = 0;
};
template <>
inline constexpr auto wire::kForm<EpochEnd> = wire::form<EpochEnd>(
    "epochEnd", wire::field("step", &EpochEnd::step), wire::field("weights", &EpochEnd::weights),
    wire::field("state", &EpochEnd::state), wire::field("lossScale", &EpochEnd::loss_scale),
    wire::field("overflowSteps", &EpochEnd::overflow_steps),
    wire::field("paused", &EpochEnd::paused), wire::field("stateBegin", &EpochEnd::state_begin),
    wire::field("stateEnd", &EpochEnd::state_end));

// Chief coordinator -> a holder of a shard of the optimizer's state, for a checkpoint: the
// updater of another worker, paused (ZeRO: EpochEnd::state_begin, state_end), or a parameter
// server, its workers paused at the epoch's end. Elements [offset, offset + count) of the shard's
// state, its rows one after another. The coordinator asks for one such piece at a time and writes
// each to disk, so that no process ever holds the whole state.
// With `weights`, of the holder's pipeline stage's weights instead (pipeline stages in workers of
// their own: a stage's worker keeps only its own stage's weights current): elements [offset,
// offset + count) of the stage's range, for the chief's evaluation and checkpoint.
struct StateRequest {
  std::int64_t step = 0;
  std::int64_t offset = 0;
  std::int64_t count = 0;
  bool weights = false;
  std::int32_t shard = 0;  // the coordinator's index of what it asks of, which the answer carries
};
template <>
inline constexpr auto wire::kForm<StateRequest> = wire::form<StateRequest>(
    "stateRequest", wire::field("step", &StateRequest::step),
    wire::field("offset", &StateRequest::offset), wire::field("count", &StateRequest::count),
    wire::field("weights", &StateRequest::weights), wire::field("shard", &StateRequest::shard));

// Updater or server -> chief coordinator: the piece of its shard's state a StateRequest asked
// for.
struct StateChunk {
  std::int64_t step = 0;
  std::int32_t shard = 0;  // StateRequest::shard
  std::int64_t offset = 0;
  Tensor values;  // host float
};
template <>
inline constexpr auto wire::kForm<StateChunk> = wire::form<StateChunk>(
    "stateChunk", wire::field("step", &StateChunk::step), wire::field("shard", &StateChunk::shard),
    wire::field("offset", &StateChunk::offset), wire::field("values", &StateChunk::values));

// A pipeline stage's activations or their gradients, or its tied weights' gradients or values, to a
// stage in another process (kernels::StageTensor): the stage actor there hands them to its
// replica's net (kernels::StageLink). The values are the sender's memory, which it leaves unchanged
// until the receiver is done with them (its next use of that memory waits for the receiver's
// answer).
template <>
inline constexpr auto wire::kForm<kernels::StageTensor> = wire::form<kernels::StageTensor>(
    "stageTensor", wire::field("step", &kernels::StageTensor::step),
    wire::field("microBatch", &kernels::StageTensor::micro_batch),
    wire::field("from", &kernels::StageTensor::from),
    wire::field("kind", &kernels::StageTensor::kind),
    wire::field("values", &kernels::StageTensor::values));

// Coordinator -> Updater: go on with the next epoch.
struct Resume {};

// Coordinator -> Updater, in an elastic run (actors/run/elastic.h): a worker waits to join, so
// pause once `step` steps are done, as at an epoch's end (EpochEnd), for the world to re-form.
struct PauseAt {
  std::int64_t step = 0;
};
template <>
inline constexpr auto wire::kForm<PauseAt> = wire::form<PauseAt>("pauseAt",
                                                                 wire::field("", &PauseAt::step));
template <>
inline constexpr auto wire::kForm<Resume> = wire::form<Resume>("resume");

// Updater -> Updater, in an elastic run: the state a new generation goes on from, from the
// process that holds the newest to each that does not (a worker that joins, one that fell a step
// behind when a peer died). It is state after `step` steps.
struct Handover {
  std::int64_t step = 0;
  Tensor weights;
  Tensor state;          // the optimizer's
  Tensor buffers;        // replica 0's (batch norm statistics); empty if the model has none
  float loss_scale = 0;  // the dynamic loss scale; 0: none
  std::int64_t overflow_steps = 0;  // steps skipped for inf or NaN gradients so far
};
template <>
inline constexpr auto wire::kForm<Handover> = wire::form<Handover>(
    "handover", wire::field("step", &Handover::step), wire::field("weights", &Handover::weights),
    wire::field("state", &Handover::state), wire::field("buffers", &Handover::buffers),
    wire::field("lossScale", &Handover::loss_scale),
    wire::field("overflowSteps", &Handover::overflow_steps));

// Coordinator -> Replica 0 and back: the replica's non-trainable state (batch-norm statistics).
struct BuffersRequest {};
struct Buffers {
  Tensor buffers;   // a copy
  int replica = 0;  // the sender's index among the run's replicas
};
template <>
inline constexpr auto wire::kForm<BuffersRequest> = wire::form<BuffersRequest>("buffersRequest");
template <>
inline constexpr auto wire::kForm<Buffers> =
    wire::form<Buffers>("buffers", wire::field("buffers", &Buffers::buffers),
                        wire::field("replica", &Buffers::replica));

// Coordinator -> Replica: evaluate these weights on the replica's shard of the test set.
struct Evaluate {
  std::int64_t epoch = 0;
  Tensor weights;
  Tensor buffers;
};
template <>
inline constexpr auto wire::kForm<Evaluate> = wire::form<Evaluate>(
    "evaluate", wire::field("epoch", &Evaluate::epoch), wire::field("weights", &Evaluate::weights),
    wire::field("buffers", &Evaluate::buffers));

// Replica -> Coordinator.
struct Evaluated {
  int replica = 0;
  double loss_sum = 0;
  double correct = 0;
  std::int64_t count = 0;
};
template <>
inline constexpr auto wire::kForm<Evaluated> = wire::form<Evaluated>(
    "evaluated", wire::field("replica", &Evaluated::replica),
    wire::field("lossSum", &Evaluated::loss_sum), wire::field("correct", &Evaluated::correct),
    wire::field("count", &Evaluated::count));

// Parameter servers. A worker's PS client pushes the reduced gradient of keys [key_begin, key_end)
// to the server that owns them ...
struct Push {
  std::int64_t step = 0;
  std::uint32_t worker = 0;
  std::int64_t key_begin = 0;
  std::int64_t key_end = 0;
  Tensor data;
};
template <>
inline constexpr auto wire::kForm<Push> =
    wire::form<Push>("push", wire::field("step", &Push::step), wire::field("worker", &Push::worker),
                     wire::field("keyBegin", &Push::key_begin),
                     wire::field("keyEnd", &Push::key_end), wire::field("data", &Push::data));

// ... then pulls the weights step `step` starts from. epoch_end: the server answers once every
// worker reached this point, and adds the optimizer state (for checkpoints).
// Keys [key_begin, key_end) must be one segment of the server's (its whole shard for the
// trainer, a KVStore key's part there for the KVStore); the reply goes to actor `reply_actor` of
// node `worker`.
struct Pull {
  std::int64_t step = 0;
  std::uint32_t worker = 0;
  bool epoch_end = false;
  std::int64_t key_begin = 0;
  std::int64_t key_end = 0;
  std::uint32_t reply_actor = 0;
};
template <>
inline constexpr auto wire::kForm<Pull> = wire::form<Pull>(
    "pull", wire::field("step", &Pull::step), wire::field("worker", &Pull::worker),
    wire::field("epochEnd", &Pull::epoch_end), wire::field("keyBegin", &Pull::key_begin),
    wire::field("keyEnd", &Pull::key_end), wire::field("replyActor", &Pull::reply_actor));

struct PullReply {
  std::int64_t step = 0;
  std::int64_t key_begin = 0;
  std::int64_t key_end = 0;
  Tensor data;
};
template <>
inline constexpr auto wire::kForm<PullReply> = wire::form<PullReply>(
    "pullReply", wire::field("step", &PullReply::step),
    wire::field("keyBegin", &PullReply::key_begin), wire::field("keyEnd", &PullReply::key_end),
    wire::field("data", &PullReply::data));

// Server -> a worker whose pull it holds: whom it waits for, so that a worker that gives up
// names that worker, not the server that waits, healthy, for it. Sent once a pull has been held
// a stall check's period, and, `final`, when the server gives up on it or knows it never comes
// (the worker it waits for is done with the store); a final one ends the worker's wait.
struct PullHeld {
  std::int64_t step = 0;
  std::int64_t key_begin = 0;
  std::int32_t late_worker = -1;  // the first worker it waits for; -1: none (the update itself)
  bool final = false;
  std::string reason;  // "server 0 holds worker 1's pull of push 5 of key 0 for worker 0 (...)"
};
template <>
inline constexpr auto wire::kForm<PullHeld> = wire::form<PullHeld>(
    "pullHeld", wire::field("step", &PullHeld::step), wire::field("keyBegin", &PullHeld::key_begin),
    wire::field("lateWorker", &PullHeld::late_worker), wire::field("final", &PullHeld::final),
    wire::field("reason", &PullHeld::reason));

// The KVStore (troupe/kvstore.h) on parameter servers. Worker 0 -> server: a new segment, keys
// [key_begin, key_end) (a KVStore key's part on this server: server s's keys start at
// s << kKvKeyShift, in the order of the inits), with its first value; answered by KvAck with the
// same id.
struct KvInit {
  std::uint64_t id = 0;
  std::uint32_t worker = 0;
  std::uint32_t reply_actor = 0;
  std::int64_t key_begin = 0;
  std::int64_t key_end = 0;
  Tensor value;
  std::int32_t key = 0;    // the KVStore's key, for messages
  std::int64_t first = 0;  // the index in the key's values of the first one sent here
};
template <>
inline constexpr auto wire::kForm<KvInit> = wire::form<KvInit>(
    "kvInit", wire::field("id", &KvInit::id), wire::field("worker", &KvInit::worker),
    wire::field("replyActor", &KvInit::reply_actor), wire::field("keyBegin", &KvInit::key_begin),
    wire::field("keyEnd", &KvInit::key_end), wire::field("value", &KvInit::value),
    wire::field("key", &KvInit::key), wire::field("first", &KvInit::first));

// An optimizer travels by its name (kernels::optimizers()).
template <>
struct wire::NamedRow<kernels::OptimizerInfo> {
  static std::string_view name(const kernels::OptimizerInfo* row) {
    return row ? row->name : kernels::optimizers().front().name;
  }
  static const kernels::OptimizerInfo* find(std::string_view name) {
    for (const auto& row : kernels::optimizers())
      if (row.name == name) return &row;
    return nullptr;
  }
};

// Worker 0 -> server: the update rule for pushes from now on (set_optimizer,
// set_gradient_compression); answered by KvAck.
struct KvConfigure {
  std::uint64_t id = 0;
  std::uint32_t worker = 0;
  std::uint32_t reply_actor = 0;
  bool has_optimizer = false;
  float learning_rate = 0;
  float rescale_grad = 1;
  std::uint8_t compression = 0;  // kernels::GradientCompression
  float threshold = 0.5f;
  // By name with its settings (its ranges are not sent: a KVStore key's part on a server is one
  // layer to LARS and LAMB).
  kernels::OptimizerSettings optimizer;
  bool new_optimizer = false;  // setOptimizer: the optimizer's state starts anew
};
template <>
inline constexpr auto wire::kForm<KvConfigure> = wire::form<KvConfigure>(
    "kvConfigure", wire::field("id", &KvConfigure::id), wire::field("worker", &KvConfigure::worker),
    wire::field("replyActor", &KvConfigure::reply_actor),
    wire::field("hasOptimizer", &KvConfigure::has_optimizer),
    wire::field("learningRate", &KvConfigure::learning_rate),
    wire::field("rescaleGrad", &KvConfigure::rescale_grad),
    wire::field("compression", &KvConfigure::compression),
    wire::field("threshold", &KvConfigure::threshold),
    wire::nested(&KvConfigure::optimizer,
                 wire::field("optimizer", &kernels::OptimizerSettings::kind),
                 wire::field("momentum", &kernels::OptimizerSettings::momentum),
                 wire::field("weightDecay", &kernels::OptimizerSettings::weight_decay),
                 wire::field("nesterov", &kernels::OptimizerSettings::nesterov),
                 wire::field("beta1", &kernels::OptimizerSettings::beta1),
                 wire::field("beta2", &kernels::OptimizerSettings::beta2),
                 wire::field("epsilon", &kernels::OptimizerSettings::epsilon),
                 wire::field("rho", &kernels::OptimizerSettings::rho),
                 wire::field("eta", &kernels::OptimizerSettings::eta)),
    wire::field("newOptimizer", &KvConfigure::new_optimizer));

// Server -> worker: the KvInit or KvConfigure `id` took effect; or, with `error` set, did not.
struct KvAck {
  std::uint64_t id = 0;
  std::string error;
};
template <>
inline constexpr auto wire::kForm<KvAck> = wire::form<KvAck>("kvAck", wire::field("id", &KvAck::id),
                                                             wire::field("error", &KvAck::error));

// Worker -> server: this worker is done with the store; the server ends once every worker is.
struct KvDone {
  std::uint32_t worker = 0;
};
template <>
inline constexpr auto wire::kForm<KvDone> = wire::form<KvDone>("kvDone",
                                                               wire::field("", &KvDone::worker));

// The cluster -> a KVStore server (in its process only, never on the wire): the link to node
// `node` is lost. A worker done with the store has left; any other fails the server naming it.
struct LinkLost {
  std::uint32_t node = 0;
  std::string address;
  std::string why;
};

// Chief coordinator -> the coordinator of every other process: the run is over, stop.
struct Shutdown {};

// Timer -> Coordinator: check that the run is still making progress.
struct Watchdog {
  std::int64_t progress_mark = 0;
};
template <>
inline constexpr auto wire::kForm<Shutdown> = wire::form<Shutdown>("shutdown");

// Timer -> Reducer, Server or PS client: look for waits on other processes that have gone on too
// long.
struct StallCheck {};

// Transport -> Reducer (in-process only): a ring chunk sent from the bucket [begin, ...) of
// `step` without a copy was written (actors/core/lease.h); the bucket may change once all were.
struct ChunkWritten {
  std::int64_t step = 0;
  std::int64_t begin = 0;
};

// Updater -> Reducer (in-process only), with sharded optimizer state (ZeRO stage 1,
// ReducerConfig::shards): this worker's shard of bucket [begin, end) of `weights` is updated for
// `step` (after `ready`); all-gather the other workers' shards of it into `weights`.
struct GatherWeights {
  std::int64_t step = 0;
  std::int64_t begin = 0;
  std::int64_t end = 0;
  Tensor weights;  // the updater's weights [begin, end), written in place
  kernels::Event ready;
};

// Reducer -> Updater (in-process only): the all-gather of GatherWeights [begin, end) of `step` is
// done; the weights hold every shard of it.
struct WeightsGathered {
  std::int64_t step = 0;
  std::int64_t begin = 0;
  std::int64_t end = 0;
  kernels::Event ready;  // weights on a GPU: after their copy back there
};

// Updater -> Reducer (in-process only), with sharded optimizer state: figures of this worker's
// shard of `step`'s gradients (clipping's sum of squares; under a loss scale, 1 where they hold
// inf or NaN) to be summed over the workers (a third ring, RingChunk::ring 2); the sums come back
// in place as SummedAcrossWorkers.
struct SumAcrossWorkers {
  std::int64_t step = 0;
  Tensor values;  // float32, on the host
};
struct SummedAcrossWorkers {
  std::int64_t step = 0;
  Tensor values;
};

// How often an actor with waits bounded by `warning` and `timeout` looks at them.
inline std::chrono::milliseconds stallCheckPeriod(std::chrono::milliseconds warning,
                                                  std::chrono::milliseconds timeout) {
  return std::clamp(std::min(warning, timeout) / 4, std::chrono::milliseconds(50),
                    std::chrono::milliseconds(1000));
}

// A hung process is named by whoever knows most, first: a server holding a pull names the worker
// it waits for at peer_timeout; the worker whose pull it holds gives up on the server a grace
// later (its watch alone would blame the server); a link's heartbeat watch, for a peer nobody
// waits on, a grace after that. The grace covers one check period of the watch before, twice.
inline std::chrono::milliseconds peerTimeoutGrace(std::chrono::milliseconds warning,
                                                  std::chrono::milliseconds timeout) {
  return std::max(std::chrono::milliseconds(1000), 2 * stallCheckPeriod(warning, timeout));
}

// Reducer -> Reducer: a chunk of a bucket on its way round a ring (roles/ring_allreduce.h).
struct RingChunk {
  enum Phase : std::uint8_t { kReduceScatter = 0, kAllGather = 1 };
  std::int64_t step = 0;
  std::int64_t bucket = 0;       // the bucket's first element in the flat gradient
  std::int64_t bucket_size = 0;  // its elements, which must be the receiver's bucket's too
  std::int64_t offset = 0;       // this chunk's first element in the flat gradient
  std::int32_t segment = 0;
  std::int32_t chunk = 0;
  std::int32_t round = 0;
  Phase phase = kReduceScatter;
  std::uint8_t ring = 0;  // which of a process's rings it belongs to (hierarchical reduction)
  kernels::Tensor data;   // float, the chunk's elements; uint8 when compressed
};
template <>
inline constexpr auto wire::kForm<RingChunk> = wire::form<RingChunk>(
    "allreduceChunk", wire::field("step", &RingChunk::step),
    wire::field("bucketBegin", &RingChunk::bucket),
    wire::field("bucketSize", &RingChunk::bucket_size), wire::field("offset", &RingChunk::offset),
    wire::field("segment", &RingChunk::segment), wire::field("chunkIndex", &RingChunk::chunk),
    wire::field("round", &RingChunk::round), wire::field("phase", &RingChunk::phase),
    wire::field("ring", &RingChunk::ring), wire::field("data", &RingChunk::data));
// Chunks of different segments and rounds need no order among them: spread over the link's
// connections.
inline int wireLane(const RingChunk& c) {
  return c.segment + c.chunk;
}

// Every message that crosses processes: each has its wire::kForm above and its schema in
// transport/wire.capnp.
using WireMessages =
    std::tuple<GradBucket, Reduced, Weights, StepDone, EpochEnd, Resume, PauseAt, Handover,
               Evaluate, Evaluated, BuffersRequest, Buffers, RingChunk, Push, Pull, PullReply,
               PullHeld, KvInit, KvConfigure, KvAck, KvDone, Subscribe, Shutdown, StateRequest,
               StateChunk, kernels::StageTensor>;

}  // namespace troupe::actors
