#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <optional>
#include <string>
#include <unordered_set>
#include <vector>

#include "actors/core/messages.h"
#include "actors/core/trace.h"
#include "actors/roles/grad_slots.h"
#include "actors/roles/roles.h"
#include "kernels/backend.h"
#include "kernels/cuda_plugin.h"
#include "kernels/flat_params.h"
#include "troupe/error.h"

namespace troupe::actors {
namespace {

class Replica final : public Actor {
 public:
  Replica(std::string name, ReplicaConfig config)
      : Actor(std::move(name)), config_(std::move(config)) {
    on<Weights>([this](Weights& w) {
      TROUPE_ENFORCE(!weights_.has_value(), "weights for step ", w.step, " arrived while step ",
                     weights_ ? weights_->step : -1, " was pending");
      weights_ = std::move(w);
      if (!batches_.count(weights_->step)) waiting_since_ = Trace::Clock::now();
      tryStep();
    });
    on<Batch>([this](Batch& b) {
      const auto step = b.step;
      batches_.emplace(step, std::move(b));
      stage();
      tryStep();
    });
    on<BuffersRequest>([this](BuffersRequest&) {
      send(config_.coordinator, Buffers{buffers(), config_.index});
    });
    on<Evaluate>([this](Evaluate& e) { evaluate(e); });
  }

  // Replica 0 of a process of an elastic run leaves its buffers for the next generation.
  ~Replica() override {
    if (config_.state && config_.local_index == 0 && net_ && net_->buffers().numel() > 0) {
      config_.state->buffers = buffers();
    }
  }

  void started() override {
    backend_ = kernels::makeBackend(
        config_.device,
        config_.budget ? config_.budget->teamOf(config_.threads, config_.budget_ways)
                       : config_.threads,
        kernels::CudaOptions{.tf32 = config_.tf32, .deterministic = config_.cudnn_deterministic});
    if (config_.device.kind != kernels::DeviceKind::kCpu) {
      copier_ = kernels::makeBackend(config_.device, 1);
    }
    net_ = kernels::makeNet(*backend_, config_.net);
    metrics_host_ = kernels::Tensor::host({2});
    if (config_.reduce_on != config_.device && config_.reduce_on.kind == kernels::DeviceKind::kCpu)
      host_grads_ = backend_->hostBuffer({net_->grads().numel()});
    if (config_.grad_slots) {
      buckets_ = net_->gradSlots();
      std::sort(buckets_.begin(), buckets_.end(),
                [](const auto& a, const auto& b) { return a.begin < b.begin; });
      net_->setGradWriteHook([this](std::int64_t begin, std::int64_t) { waitForSlot(begin); });
    }
  }

 private:
  kernels::Tensor buffers() {
    auto copy = kernels::Tensor::host({net_->buffers().numel()});
    backend_->copy(net_->buffers(), copy);
    backend_->synchronize();
    return copy;
  }

  void tryStep() {
    if (!weights_) return;
    auto it = batches_.find(weights_->step);
    if (it == batches_.end()) return;
    Batch batch = std::move(it->second);
    const int ready = static_cast<int>(batches_.size());  // this step's batch and those behind it
    batches_.erase(it);
    Weights weights = std::move(*weights_);
    weights_.reset();
    double input_wait = 0;
    if (waiting_since_) {
      const auto now = Trace::Clock::now();
      input_wait = std::chrono::duration<double>(now - *waiting_since_).count();
      if (config_.run.trace) config_.run.trace->span(name(), "input wait", *waiting_since_, now);
      waiting_since_.reset();
    }
    runStep(weights, batch, input_wait, ready);
  }

  // Memory of `slot` on this device shaped as `shape`: the slot is made anew when too small or of
  // another dtype, else reused (work queued on it runs after the work queued before).
  kernels::Tensor fitted(kernels::Tensor& slot, const kernels::Shape& shape, kernels::DType dtype) {
    const std::int64_t n = kernels::numelOf(shape);
    if (slot.numel() < n || slot.dtype() != dtype) slot = backend_->empty({n}, dtype);
    return slot.slice(0, n).view(shape);
  }

  // The tensor itself if it already lives on the replica's device, else a copy there, in `slot`.
  kernels::Tensor onDevice(const kernels::Tensor& t, kernels::Tensor& slot) {
    if (t.device() == backend_->device()) return t;
    auto copy = fitted(slot, t.shape(), t.dtype());
    backend_->copy(t, copy);
    return copy;
  }

  // Weights already on this device are read in place, not copied. Their sender (the updater,
  // the PS client, the coordinator) changes a range of them only once every replica has handed
  // in that range's gradients for the step, when no replica reads it any more. Undefined: the net
  // goes on with those it reads.
  void adopt(const kernels::Tensor& weights, const kernels::Tensor& buffers,
             const kernels::Event& ready = {}) {
    backend_->waitFor(ready);
    if (weights.defined()) net_->useWeights(onDevice(weights, own_weights_));
    if (buffers.defined() && buffers.numel() > 0) backend_->copy(buffers, net_->buffers());
  }

  // A batch's images as floats on this device. uint8 ones (input_dtype uint8) cross to it as
  // bytes, a quarter of the floats, and are normalised there.
  kernels::Tensor deviceImages(const kernels::Tensor& images) {
    if (images.dtype() != kernels::DType::kUInt8) return onDevice(images, images_here_);
    TraceScope span(config_.run.trace, name(), "normalise");
    const kernels::Tensor bytes = onDevice(images, bytes_here_);
    const kernels::Tensor out = fitted(floats_, images.shape(), kernels::DType::kFloat32);
    backend_->normalise(bytes, out, config_.input.mean, config_.input.scale);
    return out;
  }

  // On a device, each batch is copied there on a stream of its own (copier_) as soon as one of two
  // slots is free, so that the copy of step t+1's batch overlaps step t's compute. A slot is free
  // once the step that used it was queued; the copy into it waits for that step's reads on the
  // device, and the step that reads it waits for the copy. Where the net converts its images into
  // its own memory (another precision, channels-last: Net::ownInput), one slot of images serves
  // every step, free once the step's images are converted, so that the next batch's copy still
  // overlaps the rest of the step (ResNet-50 at batch 256: 147 MiB of float32 images less); the
  // labels, which the loss reads at the step's end, keep two.
  struct Slot {
    kernels::Tensor images, labels;
    kernels::Event read;  // after the last step that read it
    bool staged = false;  // holds a batch whose step has not been queued yet
  };
  struct Staged {
    kernels::Tensor images, labels;  // views of a slot
    kernels::Event copied;
  };

  void stage() {
    if (!copier_) return;
    for (const auto& [step, batch] : batches_) {
      Slot& slot = slots_[step % 2];
      Slot& pictures = net_->convertsImages() ? images_slot_ : slot;
      if (staged_.count(step) || slot.staged || pictures.staged) continue;
      const void* before[] = {pictures.images.raw(), slot.labels.raw()};
      Staged s{fitted(pictures.images, batch.images.shape(), batch.images.dtype()),
               fitted(slot.labels, batch.labels.shape(), kernels::DType::kInt32),
               {}};
      if (pictures.images.raw() != before[0] || slot.labels.raw() != before[1]) {
        slot.read = backend_->record();  // after its zero fill, queued on the compute stream
        pictures.read = slot.read;
      }
      copier_->waitFor(slot.read);
      if (&pictures != &slot) copier_->waitFor(pictures.read);
      copier_->copy(batch.images, s.images);
      copier_->copy(batch.labels, s.labels);
      s.copied = copier_->record();
      slot.staged = pictures.staged = true;
      staged_.emplace(step, std::move(s));
    }
  }

  void runStep(const Weights& weights, const Batch& batch, double input_wait, int ready) {
    const std::int64_t step = batch.step;
    adopt(weights.weights, weights.buffers, weights.ready);
    marks_.clear();
    mark("start");
    kernels::Tensor images, labels;
    const auto staged = staged_.find(step);
    if (staged != staged_.end()) {
      backend_->waitFor(staged->second.copied);
      images = deviceImages(staged->second.images);
      labels = staged->second.labels;
      if (net_->convertsImages()) {  // the images' slot is free once they are converted
        images = net_->ownInput(images);
        images_slot_.read = backend_->record();
        images_slot_.staged = false;
        stage();
      }
    } else {
      images = deviceImages(batch.images);
      labels = onDevice(batch.labels, labels_here_);
    }
    if (config_.run.trace) {  // the forward and backward apart, each a span of the trace
      {
        TraceScope span(config_.run.trace, name(), "forward");
        net_->forward(images, labels, /*train=*/true);
      }
      mark("forward");
      backward(step, weights.loss_scale);
    } else {
      backward(step, weights.loss_scale, &images, &labels);
      noteGraphs(step);
    }
    const kernels::Event read = backend_->record();
    send(config_.reader, BatchConsumed{step, config_.local_index, read});
    if (staged != staged_.end()) {
      Slot& slot = slots_[step % 2];
      slot.read = read;
      slot.staged = false;
      staged_.erase(staged);
      stage();
    }

    backend_->copy(net_->metrics(), metrics_host_);
    backend_->synchronize();
    traceDevice();
    const float loss_sum = metrics_host_.f32()[0];
    if (!std::isfinite(loss_sum)) {
      throw NumericError(
          fmt::format("training diverged: the loss of {} is {} on replica {} of worker {}: {}",
                      describeStep(step, config_.run.steps_per_epoch), loss_sum, config_.index,
                      config_.worker, whyNotFinite(weights.weights, images)));
    }
    // A pipeline stage without the loss scores no inputs: its pipeline's last stage does.
    const bool scored = net_->scoresBatch();
    send(config_.coordinator,
         StepDone{step, config_.index, loss_sum, metrics_host_.f32()[1],
                  scored ? batch.labels.numel() : 0, scored ? batch.skipped : 0, input_wait, ready,
                  batch.read_seconds, backend_->memory().device_peak});
    backend_->resetPeakMemory();  // each StepDone the peak of its own step
    const std::int64_t per_epoch = config_.run.steps_per_epoch;
    if (per_epoch > 0 && (step + 1) % per_epoch == 0) noteStageTimes(step);
  }

  // A pipeline stage in a process of its own, at an epoch's end: its steps' time from their start
  // here to its last backward, and the part of it that it computed. The pipeline's bubble is
  // 1 - (the stages' computing) / (K x the first stage's time, which ends last), against GPipe's
  // (K-1)/(M+K-1) (bench/pipeline_processes.py reads these lines).
  void noteStageTimes(std::int64_t step) {
    const kernels::StageTimes t = net_->stageTimes();
    if (t.steps == 0 || t.pipelined <= 0) return;
    const auto& p = config_.net.pipeline;
    const auto steps = static_cast<double>(t.steps);
    spdlog::info(
        "{}: pipeline stage {} of {}, {} steps to {}: {:.3f} ms a step from its start to this "
        "stage's last backward, {:.3f} ms of it computing ({} micro-batches)",
        name(), p.stage, p.stages, t.steps, describeStep(step, config_.run.steps_per_epoch),
        1000 * t.pipelined / steps, 1000 * t.busy / steps, p.microBatches());
  }

  // What a non-finite loss came from, for its error: the weights the step was given, the batch,
  // or neither (the forward pass overflowed on finite input: a learning rate too high).
  std::string whyNotFinite(const kernels::Tensor& weights, const kernels::Tensor& images) {
    struct Scan {
      std::int64_t bad = 0, first = -1;
      float largest = 0;
    };
    auto scan = [&](const kernels::Tensor& t) {
      const auto host = kernels::Tensor::host({t.numel()});
      backend_->copy(t.view({t.numel()}), host);
      backend_->synchronize();
      Scan r;
      for (std::int64_t i = 0; i < host.numel(); ++i) {
        const float v = host.f32()[i];
        if (!std::isfinite(v)) {
          if (r.bad++ == 0) r.first = i;
        } else {
          r.largest = std::max(r.largest, std::abs(v));
        }
      }
      return r;
    };
    // A language model's tokens are integers, finite always.
    const Scan w = scan(weights),
               x = images.dtype() == kernels::DType::kFloat32 ? scan(images) : Scan{};
    if (w.bad > 0) {
      return fmt::format("{} of the {} weights it was given are not finite (the first at {})",
                         w.bad, weights.numel(), w.first);
    }
    if (x.bad > 0) {
      return fmt::format(
          "the weights are finite, but {} of the batch's {} input values are not (the first at "
          "{}): the reader's data is bad",
          x.bad, images.numel(), x.first);
    }
    return fmt::format(
        "weights and inputs are finite (largest |weight| {:g}): the forward pass overflowed (a "
        "learning rate or weight decay too high?)",
        w.largest);
  }

  // Back-propagates, handing gradients to the reducer in buckets as soon as they are queued, each
  // with the event after which it is final, so their reduction overlaps the rest of the backward
  // pass. For a reducer on the host, a bucket on a device goes through host memory. The gradients
  // are of the loss times loss_scale (the updater's, for mixed precision), which it divides out.
  // With images and labels, the forward too (Net::trainStep: by a CUDA graph where the run's
  // cuda_graphs says so; its buckets then leave once the whole step is queued, each with the
  // graph's event after which it is final).
  void backward(std::int64_t step, float loss_scale, const kernels::Tensor* images = nullptr,
                const kernels::Tensor* labels = nullptr) {
    TraceScope span(config_.run.trace, name(), "backward");
    kernels::BucketCutter cutter(config_.first_bucket_bytes, config_.bucket_bytes);
    const kernels::Event* final_at = nullptr;  // the net's event for the bucket's last range
    auto flush = [&](std::optional<kernels::BucketCutter::Range> bucket) {
      if (!bucket) return;
      const auto [begin, end] = *bucket;
      // Where the net holds them (a pipeline stage's worker: its stage's alone; ZeRO stage 2:
      // the bucket's slot).
      kernels::Tensor grads = net_->gradParams().slice(begin, end);
      const bool to_host = host_grads_.numel() > 0;
      if (to_host) {
        auto host = kernels::FlatParams(host_grads_, net_->gradWindow()).slice(begin, end);
        backend_->copy(grads, host);
        grads = host;
      }
      mark(fmt::format("backward, to bucket [{},{})", begin, end));
      const kernels::Event ready = !marks_.empty()        ? marks_.back().at
                                   : final_at && !to_host ? *final_at
                                                          : backend_->record();
      if (const int slot = slotOf(begin); slot >= 0) config_.grad_slots->fill(slot, step, begin);
      send(config_.reducer, GradBucket{step, config_.local_index, begin, end, grads, ready});
    };
    const kernels::GradReadyFn ready = [&](std::int64_t begin, std::int64_t end,
                                           const kernels::Event* final) {
      final_at = final;
      flush(cutter.add(begin, end));
    };
    const float scale = config_.grad_scale * loss_scale;
    if (images) {
      net_->trainStep(*images, *labels, scale, ready);
    } else {
      net_->backward(scale, ready);
    }
    flush(cutter.finish());
  }

  // ZeRO stage 2: the slot of the bucket holding gradient `begin`, among the process's replicas'
  // (-1: memory of its own).
  int slotOf(std::int64_t begin) const {
    if (buckets_.empty()) return -1;
    const auto it =
        std::upper_bound(buckets_.begin(), buckets_.end(), begin,
                         [](std::int64_t b, const auto& bucket) { return b < bucket.begin; });
    TROUPE_ENFORCE(it != buckets_.begin() && begin < std::prev(it)->end, "gradient ", begin,
                   " lies in no bucket of the net's gradient slots");
    const int slot = std::prev(it)->slot;
    return slot < 0 ? -1 : config_.local_index * config_.net.grad_slots.count + slot;
  }

  // ZeRO stage 2: before the backward writes gradients from `begin` on, the bucket their slot
  // held last must be taken by the reducer (its ring done). Up to twice peer_timeout: at one the
  // reducer fails the run naming the worker its ring waits for, which ends this wait too.
  void waitForSlot(std::int64_t begin) {
    const int slot = slotOf(begin);
    if (slot < 0) return;
    const auto limit = 2 * config_.run.peer_timeout;
    const auto late = config_.grad_slots->waitFree(slot, limit);
    if (!late) return;
    throw TimeoutError(fmt::format(
        "worker {}: the backward waited {:g} s for gradient slot {}, which still holds bucket "
        "[{},...) of {}: its reduce-scatter did not end (a worker of the ring is hung or gone)",
        config_.worker, std::chrono::duration<double>(limit).count(), slot, late->begin,
        describeStep(late->step, config_.run.steps_per_epoch)));
  }

  // Says once that steps go by CUDA graphs (cuda_graphs), or why they do not.
  void noteGraphs(std::int64_t step) {
    if (!config_.net.graphs || graphs_noted_) return;
    const kernels::StepGraphStats stats = net_->graphStats();
    if (!stats.off.empty()) {
      spdlog::warn("{}: cuda_graphs: each step goes op by op: {}", name(), stats.off);
      graphs_noted_ = true;
    } else if (stats.captured > 0) {
      spdlog::info("{}: cuda_graphs: steps replayed from a CUDA graph from {} on", name(),
                   describeStep(step, config_.run.steps_per_epoch));
      graphs_noted_ = true;
    } else if (++steps_unrecorded_ >= kStepsToRepeat) {
      spdlog::warn(
          "{}: cuda_graphs: no step's inputs repeated in {} steps (the images', labels' or "
          "weights' memory, the batch or the loss scale changed every step), so each went op by "
          "op",
          name(), steps_unrecorded_);
      graphs_noted_ = true;
    }
  }

  // On a device, with a trace: the device's own times of the step's work, on a track of its own
  // ("replica/0/0 cuda:0"): forward, then backward piece by piece, each piece ending as a bucket is
  // final. The host's spans of the same work time only its queueing.
  void mark(std::string what) {
    if (config_.run.trace && backend_->device().kind != kernels::DeviceKind::kCpu)
      marks_.push_back({std::move(what), backend_->recordTimed()});
  }

  // After the step's host wait: its last mark was reached about as the wait returned, and the
  // others are placed before it by the device's clock.
  void traceDevice() {
    if (marks_.size() < 2) return;
    const auto end = Trace::Clock::now();
    const kernels::Event& last = marks_.back().at;
    auto before = [&](const kernels::Event& e) {
      return Trace::secondsBefore(end, backend_->elapsed(e, last));
    };
    const std::string track = fmt::format("{} {}", name(), kernels::toString(backend_->device()));
    for (std::size_t i = 1; i < marks_.size(); ++i)
      config_.run.trace->span(track, marks_[i].what, before(marks_[i - 1].at),
                              before(marks_[i].at));
  }

  void evaluate(const Evaluate& e) {
    Evaluated result{config_.index, 0, 0, 0};
    if (!test_) test_ = data::openDataset(config_.test);
    adopt(e.weights, e.buffers);
    // None: a pipeline stage's worker evaluates with the weights it holds, current at the pause.
    if (!e.weights.defined()) net_->prepareEvaluation();
    const std::int64_t n = test_->size();
    const std::int64_t begin = n * config_.test_part / config_.test_parts;
    const std::int64_t end = n * (config_.test_part + 1) / config_.test_parts;
    // A pipeline stage's worker without the loss: its pipeline's last stage scores the inputs.
    const bool scores = net_->scoresBatch();
    const std::int64_t max_batch = config_.net.max_batch;
    const auto& t = config_.test;
    std::vector<std::int64_t> indices;
    for (std::int64_t first = begin; first < end; first += max_batch) {
      const std::int64_t count = std::min(max_batch, end - first);
      indices.resize(static_cast<std::size_t>(count));
      for (std::int64_t i = 0; i < count; ++i)
        indices[static_cast<std::size_t>(i)] = first + i;
      if (t.sequence_length > 0) {  // token shards: a token outside the vocabulary ends the run
        auto tokens = kernels::Tensor::host({count, t.sequence_length}, kernels::DType::kInt32);
        auto labels = kernels::Tensor::host({count, t.sequence_length}, kernels::DType::kInt32);
        test_->read(indices, /*epoch=*/0, tokens.i32(), labels.i32());
        evaluateBatch(onDevice(tokens, images_here_), onDevice(labels, labels_here_), result);
        if (scores) result.count += labels.numel();
        continue;
      }
      auto images = kernels::Tensor::host({count, t.channels, t.height, t.width});
      auto labels = kernels::Tensor::host({count}, kernels::DType::kInt32);
      std::int64_t good = count;
      try {
        test_->read(indices, /*epoch=*/0, images.f32(), labels.i32());
      } catch (const data::BadRecordError&) {
        if (!config_.skip_bad_records) throw;
        good = readGoodTestRecords(indices, images, labels);
        if (good == 0) continue;
        images = images.slice(0, good * t.channels * t.height * t.width)
                     .view({good, t.channels, t.height, t.width});
        labels = labels.slice(0, good);
      }
      evaluateBatch(onDevice(images, images_here_), onDevice(labels, labels_here_), result);
      if (scores) result.count += good;
    }
    send(config_.coordinator, result);
  }

  // The loss and correct predictions of one test batch, added to `result`.
  void evaluateBatch(const kernels::Tensor& images, const kernels::Tensor& labels,
                     Evaluated& result) {
    net_->forward(images, labels, /*train=*/false);
    backend_->copy(net_->metrics(), metrics_host_);
    backend_->synchronize();
    result.loss_sum += metrics_host_.f32()[0];
    result.correct += metrics_host_.f32()[1];
  }

  // Reads the records of `indices` one by one, packing the good ones at the front of images and
  // labels; a bad one is logged (once) and left out. Returns how many are good.
  std::int64_t readGoodTestRecords(const std::vector<std::int64_t>& indices,
                                   kernels::Tensor& images, kernels::Tensor& labels) {
    const auto& t = config_.test;
    const std::size_t image_size = static_cast<std::size_t>(t.channels) * t.height * t.width;
    std::int64_t good = 0;
    std::vector<std::int64_t> one(1);
    for (const std::int64_t index : indices) {
      if (bad_test_.count(index)) continue;
      one[0] = index;
      try {
        test_->read(one, /*epoch=*/0, images.f32() + static_cast<std::size_t>(good) * image_size,
                    labels.i32() + good);
        ++good;
      } catch (const data::BadRecordError& e) {
        bad_test_.insert(index);
        spdlog::warn("{}: left out of the evaluation (skip_bad_records)", e.what());
      }
    }
    return good;
  }

  ReplicaConfig config_;
  std::unique_ptr<kernels::Backend> backend_;
  std::unique_ptr<kernels::Net> net_;
  std::unique_ptr<data::Dataset> test_;
  kernels::Tensor metrics_host_;
  bool graphs_noted_ = false;  // noteGraphs() spoke
  // Steps without a graph recorded, and how many noteGraphs() waits for one (a graph is recorded
  // at the second step with the same inputs; a replica has two staging buffers).
  std::int64_t steps_unrecorded_ = 0;
  static constexpr std::int64_t kStepsToRepeat = 8;
  kernels::Tensor own_weights_;  // a copy on this device of weights that arrive elsewhere
  kernels::Tensor host_grads_;   // buckets on their way to a reducer on the host
  std::vector<kernels::GradSlot> buckets_;                  // ZeRO stage 2: the net's, by begin
  kernels::Tensor images_here_, bytes_here_, labels_here_;  // batches copied to this device
  std::unique_ptr<kernels::Backend> copier_;                // on a device: copies batches there
  Slot slots_[2];
  Slot images_slot_;  // the images of every step where the net converts them (convertsImages)
  std::map<std::int64_t, Staged> staged_;  // batches of steps not queued yet, copied or on the way
  struct Mark {
    std::string what;  // the work that ends here
    kernels::Event at;
  };
  std::vector<Mark> marks_;  // of the step, on a device with a trace
  std::optional<Weights> weights_;
  std::map<std::int64_t, Batch> batches_;
  kernels::Tensor floats_;  // uint8 batches, normalised on this device
  // Since when the replica has had the weights of a step whose batch is not here.
  std::optional<Trace::Clock::time_point> waiting_since_;
  std::unordered_set<std::int64_t> bad_test_;  // test records found bad (each logged once)
};

}  // namespace

std::unique_ptr<Actor> makeReplica(std::string name, ReplicaConfig config) {
  return std::make_unique<Replica>(std::move(name), std::move(config));
}

}  // namespace troupe::actors
