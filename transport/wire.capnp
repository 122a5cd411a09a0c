# Every message that crosses a process boundary. One Frame per transport frame; the union names the
# message. Integers are Cap'n Proto's (little-endian); tensors travel as TensorData: raw
# little-endian float32 (or int32) bytes, flat; the receiver knows the shape from the message.
@0xe2f12062c601033c;

$import "/capnp/c++.capnp".namespace("troupe::transport::wire");

# A tensor's bytes. Either inline in this message (a Data blob that is its own segment, written
# from the tensor's memory without a copy), or a bulk part that follows the message as raw bulk
# frames (see transport/frame.h) when it is too large for one frame.
struct TensorData {
  data @0 :Data;
  # Inline bytes. The tensor starts `lead` bytes in: the sender points the blob at the 8-byte
  # aligned address at or before the tensor and writes zeros for the lead (0 or 4 bytes).
  lead @1 :UInt8;
  bulkPart @2 :Int32 = -1;
  # >= 0: the bytes are part N of Frame.bulk and `data` is empty.
  sharedPart @3 :Int32 = -1;
  # >= 0: the bytes are part N of Frame.shared, in the sender's arena; `data` is empty.
}

# A tensor in the sender's shared-memory arena (transport/shared_arena.h), for links between
# processes of one host whose receiver has mapped that arena.
struct SharedPart {
  offset @0 :UInt64;  # of the bytes in the arena
  bytes @1 :UInt64;
}

# First frame on every link, in both directions.
struct Hello {
  node @0 :UInt32;
  runId @1 :Text;
  address @2 :Text;  # what the sender listens on: "tcp://ip:port;unix://@name"
  # Unix-socket links only: the sender's shared arena, which the receiver may map and then
  # acknowledge with arenaMapped (empty path: none).
  arenaPath @3 :Text;
  arenaToken @4 :UInt64;
  arenaBytes @5 :UInt64;
  incarnation @6 :Text;  # the run's incarnation (TransportOptions::incarnation)
  lane @7 :UInt8;  # 0: the link; k > 0: its k-th extra TCP connection (connectionsPerPeer)
}

# Replica -> Reducer: gradients [begin, end) of the flat gradient tensor.
struct GradBucket {
  step @0 :Int64;
  replica @1 :Int32;
  begin @2 :Int64;
  end @3 :Int64;
  grads @4 :TensorData;
}

# Reducer -> Updater: the sum over replicas of one bucket.
struct Reduced {
  step @0 :Int64;
  begin @1 :Int64;
  end @2 :Int64;
  grads @3 :TensorData;
  gradsAt @4 :Int64 = -1;  # where grads starts in the flat gradients; -1: at begin
}

# Updater -> Replica: the weights step `step` starts from.
struct Weights {
  step @0 :Int64;
  weights @1 :TensorData;
  buffers @2 :TensorData;  # empty: keep the replica's own
  lossScale @3 :Float32 = 1.0;  # the loss is multiplied by it before the backward
}

# Replica -> Coordinator.
struct StepDone {
  step @0 :Int64;
  replica @1 :Int32;
  lossSum @2 :Float64;
  correct @3 :Float64;
  count @4 :Int64;
  skipped @5 :Int64;  # bad records skipped in the step's batch (skip_bad_records)
  inputWait @6 :Float64;    # seconds the replica waited for the batch
  ready @7 :Int32;          # batches the replica held when the step began
  readSeconds @8 :Float64;  # the reader's time on the batch
  devicePeak @9 :Int64;     # bytes: the peak of the replica's device memory so far (0: the CPU)
}

# Updater -> Coordinator.
struct EpochEnd {
  step @0 :Int64;
  weights @1 :TensorData;
  state @2 :TensorData;
  lossScale @3 :Float32;      # 0: no loss scale
  overflowSteps @4 :Int64;    # steps skipped so far for inf or NaN gradients
  paused @5 :Bool = true;     # false: the updater went on (no weights, no state)
  stateBegin @6 :Int64;       # sharded state (ZeRO): the elements its rows hold; 0, 0: all
  stateEnd @7 :Int64;
}

# Chief coordinator -> a holder of a shard of the optimizer's state (another worker's paused
# updater under ZeRO, a parameter server): elements [offset, offset + count) of it, for a
# checkpoint ...
struct StateRequest {
  step @0 :Int64;
  offset @1 :Int64;
  count @2 :Int64;
  weights @3 :Bool;  # the holder's stage's weights, not the optimizer's state
  shard @4 :Int32;   # the coordinator's index of what it asks of, which the answer carries
}

# ... and the holder's answer.
struct StateChunk {
  step @0 :Int64;
  shard @1 :Int32;  # StateRequest.shard
  offset @2 :Int64;
  values @3 :TensorData;
}

# Pipeline stage -> the next stage's process (activations) or the one before's (their gradients):
# one micro-batch's, with pipeline_across processes; and tied weights' gradients and values, once
# a step, between the stage that reads them and the one that owns them.
struct StageTensor {
  enum Kind {
    activations @0;
    gradients @1;
    tiedGradients @2;  # once a step: a reader's part of the gradient of another stage's weights
    tiedWeights @3;    # once a step: their values, from the owner to the reader
  }
  step @0 :Int64;        # the sender's training steps so far, this one counted
  microBatch @1 :Int32;
  from @2 :Int32;        # the sending stage
  kind @3 :Kind;
  values @4 :TensorData; # float32, flat
}

# Updater -> Updater (elastic runs): the state a new generation goes on from.
struct Handover {
  step @0 :Int64;
  weights @1 :TensorData;
  state @2 :TensorData;
  buffers @3 :TensorData;
  lossScale @4 :Float32;      # the dynamic loss scale; 0: none
  overflowSteps @5 :Int64;    # steps skipped so far for inf or NaN gradients
}

# Coordinator -> Replica.
struct Evaluate {
  epoch @0 :Int64;
  weights @1 :TensorData;
  buffers @2 :TensorData;
}

# Replica -> Coordinator.
struct Evaluated {
  replica @0 :Int32;
  lossSum @1 :Float64;
  correct @2 :Float64;
  count @3 :Int64;
}

# Replica -> Coordinator: batch-norm statistics (answer to buffersRequest): replica 0's, or with
# pipeline stages in workers of their own, each stage's worker's in the first pipeline.
struct Buffers {
  buffers @0 :TensorData;
  replica @1 :Int32;  # the sender's index among the run's replicas
}

# Ring allreduce: one chunk of one bucket, in one of the two phases.
struct AllreduceChunk {
  enum Phase {
    reduceScatter @0;
    allGather @1;
  }
  obsoleteOpId @0 :UInt64;  # no longer written
  step @1 :Int64;
  bucketBegin @2 :Int64;  # element offset of the bucket in the flat gradient
  chunkIndex @3 :UInt32;
  phase @4 :Phase;
  data @5 :TensorData;
  offset @6 :Int64;    # the chunk's first element in the flat gradient
  segment @7 :UInt32;  # which segment of the bucket (each segment is its own ring)
  round @8 :UInt32;    # 0 .. world-2 within the phase
  compressed @9 :Bool;  # data is bytes of the run's gradient compression, not float32
  ring @10 :UInt8;      # which of the receiver's rings (hierarchical reduction: local or across)
  bucketSize @11 :Int64;  # the bucket's elements, which must be the receiver's bucket's too
}

# Parameter server: a worker pushes gradients of keys [keyBegin, keyEnd) ...
struct Push {
  step @0 :Int64;
  worker @1 :UInt32;
  keyBegin @2 :Int64;
  keyEnd @3 :Int64;
  data @4 :TensorData;
  compressed @5 :Bool;  # data is bytes of the run's gradient compression, not float32
}

# ... and pulls the current values of keys [keyBegin, keyEnd).
struct Pull {
  step @0 :Int64;
  worker @1 :UInt32;
  keyBegin @2 :Int64;
  keyEnd @3 :Int64;
  epochEnd @4 :Bool;  # answer once every worker reached this point, with the optimizer state
  replyActor @5 :UInt32;  # the actor of node `worker` that the reply goes to
}

struct PullReply {
  step @0 :Int64;
  keyBegin @1 :Int64;
  keyEnd @2 :Int64;
  data @3 :TensorData;
  obsoleteState @4 :TensorData;  # no longer written (the state goes by StateChunk)
}

struct KvInit {
  id @0 :UInt64;
  worker @1 :UInt32;
  replyActor @2 :UInt32;
  keyBegin @3 :Int64;
  keyEnd @4 :Int64;
  value @5 :TensorData;
  key @6 :Int32;    # the KVStore's key, for messages
  first @7 :Int64;  # the index in the key's values of the first one sent here
}

struct KvConfigure {
  id @0 :UInt64;
  worker @1 :UInt32;
  replyActor @2 :UInt32;
  hasOptimizer @3 :Bool;
  learningRate @4 :Float32;
  momentum @5 :Float32;
  weightDecay @6 :Float32;
  rescaleGrad @7 :Float32;
  nesterov @8 :Bool;
  compression @9 :UInt8;
  threshold @10 :Float32;
  optimizer @11 :Text;  # empty: sgd
  beta1 @12 :Float32;
  beta2 @13 :Float32;
  epsilon @14 :Float32;
  rho @15 :Float32;
  eta @16 :Float32;
  newOptimizer @17 :Bool;  # setOptimizer: the state starts anew
}

struct KvAck {
  id @0 :UInt64;
  error @1 :Text;  # empty: done
}

struct PullHeld {
  step @0 :Int64;
  keyBegin @1 :Int64;
  lateWorker @2 :Int32;  # -1: none
  final @3 :Bool;        # the server gives up on the pull: the worker's wait ends
  reason @4 :Text;
}

struct Subscribe {
  actor @0 :UInt32;
  every @1 :Int64;
  node @2 :UInt32;
}

struct Frame {
  target @0 :UInt32;       # actor id on the receiving node
  sourceNode @1 :UInt32;
  sourceActor @2 :UInt32;
  bulk @3 :List(UInt64);   # byte sizes of the bulk parts that follow this frame
  shared @22 :List(SharedPart);  # tensors in the sender's shared arena
  union {
    none @4 :Void;  # the default; never sent
    hello @5 :Hello;
    gradBucket @6 :GradBucket;
    reduced @7 :Reduced;
    weights @8 :Weights;
    stepDone @9 :StepDone;
    epochEnd @10 :EpochEnd;
    resume @11 :Void;
    evaluate @12 :Evaluate;
    evaluated @13 :Evaluated;
    buffersRequest @14 :Void;
    buffers @15 :Buffers;
    allreduceChunk @16 :AllreduceChunk;
    push @17 :Push;
    pull @18 :Pull;
    pullReply @19 :PullReply;
    shutdown @20 :Void;  # chief coordinator -> the other processes: the run is over
    arenaMapped @21 :Void;  # answer to a Hello's arena: mapped, send shared parts from now on
    heartbeat @23 :Void;    # a link with nothing else to send says it is alive
    refusal @24 :Text;      # the sender refuses this link, and says why; it closes it next
    pauseAt @25 :Int64;     # coordinator -> updater (elastic runs): pause after this step count
    handover @26 :Handover;
    kvInit @27 :KvInit;          # the KVStore on parameter servers (troupe/kvstore.h)
    kvConfigure @28 :KvConfigure;
    kvAck @29 :KvAck;
    kvDone @30 :UInt32;          # the worker that is done with the store
    subscribe @31 :Subscribe;    # an observer of the run -> the chief's updater
    pullHeld @32 :PullHeld;      # server -> the worker whose pull it holds: whom it waits for
    stateRequest @33 :StateRequest;  # chief coordinator -> a sharded updater, for a checkpoint
    stateChunk @34 :StateChunk;
    stageTensor @35 :StageTensor;  # pipeline stage -> stage, across processes
  }
}
