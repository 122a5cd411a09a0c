// A training run in one process: Readers -> Replicas -> Reducer -> Updater, driven by a
// Coordinator, all actors on one Runtime. apps/ fills TrainOptions from a config file and
// flags; a service can fill it itself and call runTraining.
#pragma once

#include <atomic>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "actors/schedules/schedule.h"
#include "data/db.h"
#include "data/image_transform.h"
#include "kernels/compression.h"
#include "kernels/named.h"
#include "kernels/net.h"
#include "kernels/optimizer.h"
#include "kernels/tensor.h"
#include "troupe/trainer.h"

namespace troupe::actors {

// The names the keys below take (kernels/named.h): the options hold the values.
using kernels::Named;
using kernels::nameIn;

// What a process is in its run (troupe launch's TROUPE_ROLE, MXNet's DMLC_ROLE): a worker trains
// replicas; a server holds a shard of the weights (dist_sync, dist_async, ssp).
enum class ProcessRole : std::uint8_t { kWorker, kServer };
inline constexpr Named<ProcessRole> kRoles[] = {{"worker", ProcessRole::kWorker},
                                                {"server", ProcessRole::kServer}};
inline const char* roleName(ProcessRole role) {
  return nameIn(kRoles, role);
}

// The precision keys' and input_dtype's names.
inline constexpr Named<kernels::DType> kPrecisions[] = {{"fp32", kernels::DType::kFloat32},
                                                        {"fp16", kernels::DType::kFloat16},
                                                        {"bf16", kernels::DType::kBFloat16}};
inline const char* precisionName(kernels::DType precision) {
  return nameIn(kPrecisions, precision);
}
inline constexpr Named<kernels::DType> kInputTypes[] = {{"float32", kernels::DType::kFloat32},
                                                        {"uint8", kernels::DType::kUInt8}};

// How images lie in GPU memory (memory_format).
enum class MemoryFormat : std::uint8_t { kAuto, kNchw, kNhwc };
inline constexpr Named<MemoryFormat> kMemoryFormats[] = {
    {"auto", MemoryFormat::kAuto}, {"nchw", MemoryFormat::kNchw}, {"nhwc", MemoryFormat::kNhwc}};

struct TrainOptions {
  kernels::ModelSpec model;
  bool zero_init_residual = false;  // kernels::NetOptions::zero_init_residual
  // No weight decay on biases and batch-norm scales and shifts (Goyal et al.; GluonCV's --no-wd).
  bool no_wd = false;
  std::string train_data;
  std::string test_data;  // empty: no evaluation (test_accuracy -1 in the log)
  data::DbType db_type = data::DbType::kLmdb;
  int num_channels = 1;
  int image_size = 28;
  int num_labels = 10;
  // Language models (gpt2, lstm): above 0, samples are sequences of this many tokens read from
  // token shards (data/token_shards.h), each token labelled with the next (nanoGPT's block_size);
  // 0: images.
  std::int64_t block_size = 0;
  std::int64_t vocab_size = 50257;  // tokens a language model knows (GPT-2's BPE)
  kernels::GptShape gpt;            // n_layer, n_head, n_embd
  kernels::LstmShape lstm;          // nlayers, nhid, emsize, dropout, tied
  // Bytes a worker process may hold for its model (weights, gradients, the optimizer's state,
  // activations): a run that needs more is refused before it starts. 0: no limit.
  std::int64_t max_memory = 0;
  float mean = 0.0f;
  float scale = 1.0f / 255.0f;
  // Caffe2's per-channel normalisation, (value - mean_c) / std_c, replacing mean and scale.
  std::vector<double> mean_per_channel;
  std::vector<double> std_per_channel;
  // Crops, resizing, mirror and colour jitter of the image input (data/image_transform.h); with
  // crop > 0, image_size is crop and records may be of any size.
  data::ImageTransformOptions transform;
  int decode_threads = 1;  // per reader (and per replica's test set)
  // One reader per process feeds all its replicas, its decode_threads decoding for all of them
  // (MXNet's one iterator per process), instead of a reader per replica. Not with reader_factory.
  bool shared_reader = false;
  // Random inputs made once and sent every step (Caffe2's --train_data null): for measuring the
  // compute alone, with no reading or decoding. Needs epoch_size; not with train_data.
  bool synthetic = false;
  // float32, or uint8: readers send training images as bytes before the mean and scale, and
  // each replica normalises them on its device (MXNet's ImageRecordIter dtype).
  kernels::DType input_dtype = kernels::DType::kFloat32;

  // The schedule with its family's settings (the keys schedule, allreduce, reducer and
  // staleness; actors/schedules/schedule.h).
  Schedule schedule;
  // Processes of the run (Caffe2's --num_shards / --shard_id); set by `troupe launch` through
  // TROUPE_NUM_WORKERS / TROUPE_RANK, or by hand. With several, batch_size is per process.
  int num_shards = 1;   // workers
  int shard_id = 0;     // this worker's rank, or this server's with role "server"
  int num_servers = 0;  // parameter servers (dist_sync, dist_async, ssp)
  // An elastic run (num_workers = "MIN:MAX", actors/run/elastic.h): between min_workers and
  // max_workers workers, which re-form between steps when one dies or one joins; num_shards and
  // shard_id then come from each generation's rendezvous. 0: a fixed world of num_shards.
  int min_workers = 0;
  int max_workers = 0;
  ProcessRole role = ProcessRole::kWorker;  // TROUPE_ROLE
  std::string run_id;                       // shared by the processes of one run
  // Restarts of the run so far (troupe launch --on-failure restart sets TROUPE_GENERATION). Each
  // generation meets under its own rendezvous prefix and transport id, so processes of an earlier
  // one never mix in; a generation > 0 resumes as `resume = "auto"` does.
  int generation = 0;
  std::string
      rendezvous;  // a store URL (rendezvous/url.h); rank 0 serves a tcp:// one started by hand
  bool serve_store = false;  // set when no launcher serves the store
  std::string interface;     // network interface to listen on
  std::string secret_file;   // holds the run's secret; empty: $TROUPE_SECRET
  std::string secret;        // the run's secret, read from there (never logged)
  double rendezvous_timeout_s = 60;
  // A collective or server waiting this long on a peer fails the run naming the peer by role and
  // rank (PeerError); a wait of stall_warning logs a stall report first. A worker's pull, which a
  // server may hold for another worker, and a link silent (no heartbeat) for a peer nobody waits
  // on, fail a grace or two later (messages.h, peerTimeoutGrace): whoever knows the culprit
  // names it first.
  double peer_timeout_s = 60;
  double stall_warning_s = 30;
  int replicas = 1;
  // Pipeline parallelism in each replica (kernels::PipelineOptions).
  kernels::PipelineOptions pipeline;
  // The GPUs of this process (Caffe2's --gpus / --num_gpus): replica r on cuda:gpus[r], so
  // replicas = gpus.size(); empty: every replica on the CPU.
  std::vector<int> gpus;
  // On GPUs, convolutions and matrix products in TensorFloat-32 (PyTorch's allow_tf32, Caffe2's
  // --enable_tensor_core); off, fp32 ops compute in IEEE fp32, as the CPU does.
  bool tf32 = false;
  // On GPUs, convolutions only with cuDNN's deterministic algorithms, so that a run repeats to the
  // bit (PyTorch's torch.backends.cudnn.deterministic); off, the fastest measured.
  bool cudnn_deterministic = false;
  // On GPUs, each training step's forward and backward by a CUDA graph, recorded at the second
  // step with the same inputs and replayed (kernels::NetOptions::graphs): one launch a step for
  // the host instead of a call an op. Not in a traced run, nor for a model with dropout. Unset
  // (auto): on wherever GPUs train, unless traced; true without GPUs is an error.
  std::optional<bool> cuda_graphs;
  // Mixed precision on GPUs (kernels::NetOptions::precision): fp32, fp16 or bf16 activations and
  // convolution/matrix arithmetic, float32 master weights, gradients and updates.
  kernels::DType precision = kernels::DType::kFloat32;
  // The loss scale of fp16: 0 is dynamic (PyTorch's GradScaler: 2^16 to start, halved on a step
  // whose gradients hold inf or NaN, which is skipped, and doubled after loss_scale_window steps
  // without one); > 0 fixes it (a step with inf or NaN then fails the run). bf16 and fp32 need
  // none (1) unless one is given.
  double loss_scale = 0;
  int initial_scale_power = 16;  // a dynamic scale starts at 2^this (DeepSpeed's key)
  std::int64_t loss_scale_window = 2000;
  // Images in GPU memory: nhwc (channels last, PyTorch's channels_last: cuDNN's tensor-core
  // convolutions read it natively), nchw, or auto: nhwc where tensor cores compute (fp16, bf16,
  // or tf32) and the model is the same either way (no inner product reads an image).
  MemoryFormat memory_format = MemoryFormat::kAuto;
  int threads = 0;                     // 0: all hardware threads
  std::int64_t batch_size = 64;        // per process, over its replicas
  std::vector<double> work_load_list;  // relative share of each replica; empty: equal
  std::int64_t epoch_size = 0;         // inputs per epoch; 0: the training set's size
  std::int64_t num_epochs = 1;
  std::uint64_t seed = 1;
  int prefetch = 4;
  // A training record that does not parse, decode or fit is skipped (its slot in the batch goes to
  // the next good record of the epoch's order), logged once per reader with its key and counted
  // in the CSV log's skipped_records column; a bad test record is left out of the evaluation.
  // false: such a record ends the run, naming the database and the key.
  bool skip_bad_records = false;

  float base_learning_rate = 0.01f;
  kernels::LrSchedule lr_policy = kernels::LrSchedule::kFixed;
  float gamma = 0.1f;
  double lr_step_epochs = 0;          // step: decay every this many epochs
  std::vector<double> lr_milestones;  // multistep: epochs at which to decay
  double warmup_epochs = 0;
  float lr_power = 2.0f;                 // poly: the exponent (MLPerf's LARS runs use 2)
  float lr_end = 0.0f;                   // poly: the rate at the run's last step
  kernels::OptimizerSettings optimizer;  // by name (kernels/optimizer.h's table)
  // Gradients scaled down to this global L2 norm where it is above (torch's clip_grad_norm_);
  // 0: none.
  float clip_grad_norm = 0.0f;
  // The softmax loss's target puts 1 - this on the label and this / classes on every class
  // (PyTorch's CrossEntropyLoss label_smoothing; Szegedy et al. 2016).
  float label_smoothing = 0.0f;

  // What gradients travel as between processes (kernels/compression.h): none, fp16, bf16 or 2bit
  // (MXNet's, with gradient_compression_threshold), on the ring and on pushes to the servers.
  // Every process of a run must agree (checked at rendezvous).
  kernels::GradientCompression gradient_compression = kernels::GradientCompression::kNone;
  float gradient_compression_threshold = 0.5f;

  // TCP connections to each peer on another host; ring chunks spread over them (as NCCL's
  // NCCL_NSOCKS_PERTHREAD x NCCL_SOCKET_NTHREADS and Gloo's several pairs do). 1 until a gain is
  // measured: on the 2-core test machine both ends of every link share two cores, and 2 showed
  // none within its noise (bench/allreduce_hosts.py --troupe-args="--connections 2").
  int connections_per_peer = 1;

  double bucket_size_mb = 25;
  // The pieces troupe's ring pipelines a bucket in between processes (each its own ring), and in
  // which a GPU's sum goes to host memory and back: smaller overlaps more, larger sends fewer
  // messages. Every process of a run must agree (checked at rendezvous).
  double ring_segment_mb = 4;
  double first_bucket_mb = 1;

  std::string log_dir = ".";
  std::string checkpoint_dir;         // empty: log_dir
  std::int64_t checkpoint_every = 0;  // epochs; 0: only at the end
  // The checkpoint to continue from, or "auto": the newest complete checkpoint of this run (same
  // run_id) in checkpoint_dir, from scratch if there is none, nothing left to do if it holds the
  // run's last step.
  std::string resume;
  std::int64_t log_every = 100;  // console line every this many steps
  double step_timeout_s = 300;   // no progress for this long: the run fails naming who is late
  std::string run_name;          // experiment id prefix; empty: the model's name
  std::string trace;             // Chrome trace file to write; empty: none

  // Not a key: the readers of one's own (TrainerData::reader, troupe/trainer.h) that replace the
  // training database's; null: read train_data.
  std::function<std::unique_ptr<ReaderActor>(const ReaderSpec&)> reader_factory;

  // The flags as given, written at the top of the CSV log.
  std::vector<std::pair<std::string, std::string>> parameters;
};

struct EpochResult {
  std::int64_t epoch = 0;
  double loss = 0;
  double accuracy = 0;
  double test_accuracy = -1;
  double inputs_per_sec = 0;
  std::int64_t skipped_records = 0;  // bad training records skipped in the epoch
};

struct TrainResult {
  bool stopped = false;      // ended early on RunControl::stop
  std::string resumed_from;  // the checkpoint the run continued from; empty: from scratch
  std::string experiment_id;
  std::string log_path;
  std::vector<std::string> checkpoints;
  std::vector<EpochResult> epochs;
  std::int64_t steps = 0;
  // Final parameters, host; undefined for pipeline stages in workers of their own (each holds
  // its stage's alone: the last checkpoint has them all).
  kernels::Tensor weights;
};

// Validates the options (InputError naming the offending one), opens the data, trains, and returns
// when the last epoch is done. Errors from any actor end the run and are rethrown here (the
// actor's exception nested, Runtime::run). A loss or an update that is not finite ends it with
// a NumericError naming the step, the epoch and the replica or process: a diverged run writes no
// checkpoint. A run that fails because another process of it is hung or gone (PeerError, peer.h)
// first prints one line on stderr for the launcher: "troupe-culprit: server 0: <reason>".
TrainResult runTraining(const TrainOptions& options, struct RunControl* control = nullptr);

// What a caller of runTraining watches and asks of the run while it goes (the public
// troupe::Trainer, include/troupe/trainer.h). The chief's coordinator calls the callbacks and
// reads the requests between steps; a request pauses every updater kPauseMargin steps on, as a
// worker joining an elastic run does.
struct RunControl {
  TrainerCallbacks callbacks;
  std::atomic<bool> stop{false};
  std::atomic<bool> checkpoint_at_stop{true};
  std::atomic<bool> checkpoint{false};
  std::atomic<std::int64_t> steps{0};  // steps done, for the caller to read
  // The world of the run's current generation, set as it spawns (0: not formed yet).
  std::atomic<int> workers{0};
  std::atomic<int> servers{0};
};

}  // namespace troupe::actors
