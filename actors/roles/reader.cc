#include <spdlog/spdlog.h>

#include <unordered_set>

#include "actors/core/messages.h"
#include "actors/core/trace.h"
#include "actors/roles/roles.h"
#include "kernels/cuda_plugin.h"
#include "kernels/random.h"
#include "troupe/error.h"

namespace troupe::actors {
namespace {

class Reader final : public Actor {
 public:
  Reader(std::string name, ReaderConfig config)
      : Actor(std::move(name)),
        config_(std::move(config)),
        next_(config_.targets.size(), config_.plan.first_step),
        in_flight_(config_.targets.size(), 0),
        pool_(config_.pinned ? config_.targets.size() : 0,
              std::vector<Slot>(static_cast<std::size_t>(config_.prefetch))) {
    on<BatchConsumed>([this](BatchConsumed& m) {
      const std::size_t t = targetOf(m.replica);
      --in_flight_[t];
      if (config_.pinned) slotOf(t, m.step).consumed = m.ready;
      fill();
    });
  }

  void started() override {
    if (config_.synthetic) {
      makeSynthetic();
      fill();
      return;
    }
    dataset_ = data::openDataset(config_.dataset);
    if (config_.plan.global_batch > 0 && dataset_->size() == 0) {
      throw InputError("training database '" + config_.dataset.path + "' has no records");
    }
    fill();
  }

 private:
  std::size_t targetOf(int replica) const {
    for (std::size_t t = 0; t < config_.targets.size(); ++t) {
      if (config_.targets[t].local_index == replica) return t;
    }
    throw InvariantError(fmt::format("{} feeds no replica {}", name(), replica));
  }

  // Step by step, each replica's share in turn: the replica furthest behind with credit first.
  void fill() {
    for (;;) {
      std::size_t best = config_.targets.size();
      for (std::size_t t = 0; t < config_.targets.size(); ++t) {
        if (in_flight_[t] < config_.prefetch && next_[t] < config_.plan.last_step &&
            (best == config_.targets.size() || next_[t] < next_[best])) {
          best = t;
        }
      }
      if (best == config_.targets.size()) return;
      send(config_.targets[best].replica, read(next_[best]++, best));
      ++in_flight_[best];
    }
  }

  // Host memory for a batch: plain, or pinned (config_.pinned).
  kernels::Tensor hostTensor(kernels::Shape shape, kernels::DType dtype) const {
    return config_.pinned ? kernels::pinnedHostBuffer(std::move(shape), dtype, config_.device)
                          : kernels::Tensor::hostUninitialized(std::move(shape), dtype);
  }
  // A batch of `count` samples: images [count, C, H, W], or token sequences [count, t] with a
  // label a token.
  kernels::Shape imageShape(std::int64_t count) const {
    const auto& d = config_.dataset;
    if (d.sequence_length > 0) return {count, d.sequence_length};
    return {count, d.channels, d.height, d.width};
  }
  kernels::Shape labelShape(std::int64_t count) const {
    const auto& d = config_.dataset;
    if (d.sequence_length > 0) return {count, d.sequence_length};
    return {count};
  }
  kernels::DType imageType() const {
    if (config_.dataset.sequence_length > 0) return kernels::DType::kInt32;
    return config_.dataset.uint8 ? kernels::DType::kUInt8 : kernels::DType::kFloat32;
  }

  // A pinned batch buffer of target t: the one of `step` modulo prefetch. In flight are at most
  // prefetch batches, consumed in step order, so its last batch was consumed; its memory is
  // written again once that batch's copy to the device is done.
  struct Slot {
    kernels::Tensor images, labels;
    kernels::Event consumed;
  };
  Slot& slotOf(std::size_t t, std::int64_t step) {
    return pool_[t][static_cast<std::size_t>(step % config_.prefetch)];
  }
  void takeBuffers(std::size_t t, std::int64_t step, Batch& batch) {
    const std::int64_t count = config_.targets[t].count;
    if (!config_.pinned) {
      batch.images = hostTensor(imageShape(count), imageType());
      batch.labels = hostTensor(labelShape(count), kernels::DType::kInt32);
      return;
    }
    Slot& slot = slotOf(t, step);
    if (slot.images.numel() == 0) {
      slot.images = hostTensor(imageShape(count), imageType());
      slot.labels = hostTensor(labelShape(count), kernels::DType::kInt32);
    }
    slot.consumed.wait();  // a host wait for a copy that is done nearly always
    batch.images = slot.images;
    batch.labels = slot.labels;
  }

  // One batch of each target's size: images uniform in [-1, 1) (bytes uniform in [0, 256) for
  // uint8 input; tokens uniform in the vocabulary) and labels uniform in [0, num_labels), from
  // the seed and the target.
  void makeSynthetic() {
    const auto& d = config_.dataset;
    for (const auto& target : config_.targets) {
      Batch b;
      b.images = hostTensor(imageShape(target.count), imageType());
      b.labels = hostTensor(labelShape(target.count), kernels::DType::kInt32);
      const auto stream = static_cast<std::uint64_t>(target.offset) * 2;
      const auto labels = static_cast<std::uint64_t>(d.num_labels);
      for (std::int64_t i = 0; i < b.images.numel(); ++i) {
        const std::uint64_t bits = kernels::randomBits(config_.seed, stream, i);
        if (b.images.dtype() == kernels::DType::kInt32) {
          b.images.i32()[i] = static_cast<std::int32_t>(bits % labels);
        } else if (d.uint8) {
          static_cast<std::uint8_t*>(b.images.raw())[i] = static_cast<std::uint8_t>(bits >> 56);
        } else {
          b.images.f32()[i] = 2.0f * kernels::uniform01(bits) - 1.0f;
        }
      }
      for (std::int64_t i = 0; i < b.labels.numel(); ++i) {
        b.labels.i32()[i] =
            static_cast<std::int32_t>(kernels::randomBits(config_.seed, stream + 1, i) % labels);
      }
      synthetic_.push_back(std::move(b));
    }
    spdlog::info("{}: synthetic input, {} random batch(es) made once and sent every step", name(),
                 synthetic_.size());
  }

  Batch read(std::int64_t step, std::size_t t) {
    const ReaderTarget& target = config_.targets[t];
    if (config_.synthetic) {
      Batch b = synthetic_[t];
      b.step = step;
      return b;
    }
    const auto& plan = config_.plan;
    const std::int64_t epoch = plan.epochOf(step);
    if (epoch != order_epoch_) {
      order_ = data::epochOrder(dataset_->size(), config_.seed, epoch);
      order_epoch_ = epoch;
    }
    const std::int64_t first = plan.recordOf(step) + target.offset;
    indices_.resize(static_cast<std::size_t>(target.count));
    const auto n = static_cast<std::int64_t>(order_.size());
    for (std::int64_t i = 0; i < target.count; ++i) {
      indices_[static_cast<std::size_t>(i)] = order_[static_cast<std::size_t>((first + i) % n)];
    }
    Batch batch;
    batch.step = step;
    takeBuffers(t, step, batch);
    const auto began = Trace::Clock::now();
    try {
      readInto(indices_, epoch, batch.images, 0, batch.labels.i32());
    } catch (const data::BadRecordError&) {
      if (!config_.skip_bad_records) throw;
      batch.skipped = readSkipping(first, epoch, batch);
    }
    const auto ended = Trace::Clock::now();
    batch.read_seconds = std::chrono::duration<double>(ended - began).count();
    if (config_.run.trace) config_.run.trace->span(name(), "read", began, ended);
    return batch;
  }

  // The batch again, record by record: a bad record's slot goes to the next good record of the
  // epoch's order. Returns how many slots held a bad record.
  std::int64_t readSkipping(std::int64_t first, std::int64_t epoch, Batch& batch) {
    const auto& d = config_.dataset;
    const auto n = static_cast<std::int64_t>(order_.size());
    std::int64_t skipped = 0;
    std::vector<std::int64_t> one(1);
    const std::int64_t samples = batch.images.dim(0);
    for (std::int64_t i = 0; i < samples; ++i) {
      std::int32_t* label = batch.labels.i32() + i * d.labelsPerSample();
      bool slot_bad = false;
      for (std::int64_t probe = 0;; ++probe) {
        if (probe == n) {
          throw InputError("training database '" + d.path + "': every one of its " +
                           std::to_string(n) + " records is bad (skip_bad_records)");
        }
        one[0] = order_[static_cast<std::size_t>((first + i + probe) % n)];
        if (bad_.count(one[0])) {
          slot_bad = slot_bad || probe == 0;
          continue;
        }
        try {
          readInto(one, epoch, batch.images, i, label);
          break;
        } catch (const data::BadRecordError& e) {
          bad_.insert(one[0]);
          slot_bad = slot_bad || probe == 0;
          spdlog::warn("{}: skipped (skip_bad_records)", e.what());
        }
      }
      skipped += slot_bad ? 1 : 0;
    }
    return skipped;
  }

  // Reads records into images from slot `first` on, as floats, (DatasetOptions::uint8) bytes,
  // or tokens.
  void readInto(const std::vector<std::int64_t>& indices, std::int64_t epoch,
                const kernels::Tensor& images, std::int64_t first, std::int32_t* labels) {
    const auto at = static_cast<std::size_t>(first * config_.dataset.sampleSize());
    if (images.dtype() == kernels::DType::kInt32) {
      dataset_->read(indices, epoch, images.i32() + at, labels);
    } else if (images.dtype() == kernels::DType::kUInt8) {
      dataset_->read(indices, epoch, static_cast<std::uint8_t*>(images.raw()) + at, labels);
    } else {
      dataset_->read(indices, epoch, images.f32() + at, labels);
    }
  }

  ReaderConfig config_;
  std::unique_ptr<data::Dataset> dataset_;
  std::vector<std::int64_t> order_;
  std::int64_t order_epoch_ = -1;
  std::vector<std::int64_t> indices_;
  std::unordered_set<std::int64_t> bad_;  // records found bad (each logged once)
  std::vector<std::int64_t> next_;        // per target: the step of its next batch
  std::vector<int> in_flight_;            // per target: batches sent and not yet consumed
  std::vector<Batch> synthetic_;          // per target, with config_.synthetic
  std::vector<std::vector<Slot>> pool_;   // per target, with config_.pinned
};

}  // namespace

std::unique_ptr<Actor> makeReader(std::string name, ReaderConfig config) {
  TROUPE_ENFORCE_GT(config.plan.steps_per_epoch, 0);
  TROUPE_ENFORCE(!config.targets.empty());
  return std::make_unique<Reader>(std::move(name), std::move(config));
}

}  // namespace troupe::actors
