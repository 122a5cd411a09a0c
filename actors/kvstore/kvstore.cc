// troupe::KVStore (include/troupe/kvstore.h): the local store, on troupe's optimizer and
// gradient compression kernels; the distributed ones are in actors/kvstore/kvstore_dist.cc.
#include "troupe/kvstore.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>

#include "actors/config/train_config.h"
#include "actors/core/status_of.h"
#include "actors/kvstore/kvstore_dist.h"
#include "actors/kvstore/kvstore_options.h"
#include "kernels/backend.h"
#include "kernels/compression.h"
#include "kernels/optimizer.h"
#include "troupe/error.h"

namespace troupe {
namespace {

Status inputError(std::string message) {
  return {ErrorKind::kInput, std::move(message)};
}

class LocalKVStore final : public KVStore {
 public:
  explicit LocalKVStore(std::string type)
      : type_(std::move(type)), backend_(kernels::makeCpuBackend(1)) {}

  using KVStore::pull;
  using KVStore::push;
  std::string type() const override { return type_; }
  int rank() const override { return 0; }
  int numWorkers() const override { return 1; }

  Status init(int key, std::span<const float> value) override {
    if (Status s = actors::checkInit(key, value.size(), entries_.count(key) > 0); !s) return s;
    Entry e;
    e.value = kernels::Tensor::host({static_cast<std::int64_t>(value.size())});
    std::copy(value.begin(), value.end(), e.value.f32());
    entries_.emplace(key, std::move(e));
    return {};
  }

  Status push(int key, const std::vector<std::span<const float>>& values, int) override {
    const auto it = entries_.find(key);
    if (it == entries_.end()) return neverInitialised("push", key);
    auto& e = it->second;
    const auto n = e.value.numel();
    if (values.empty()) return inputError(fmt::format("push of key {}: no array", key));
    auto sum = kernels::Tensor::host({n});
    std::fill_n(sum.f32(), n, 0.0f);
    for (std::size_t i = 0; i < values.size(); ++i) {
      if (static_cast<std::int64_t>(values[i].size()) != n) {
        return inputError(fmt::format("push of key {}: array {} has {} values, the key's has {}",
                                      key, i, values[i].size(), n));
      }
      for (std::int64_t j = 0; j < n; ++j)
        sum.f32()[j] += values[i][static_cast<std::size_t>(j)];
    }
    try {
      if (compression_.type != kernels::GradientCompression::kNone) compress(e, sum);
      return updater_.apply(*backend_, e.updates, e.value, sum, fmt::format("push of key {}", key));
    } catch (const Error& e) {
      return {ErrorKind::kInternal, e.what()};
    }
  }

  Status pull(int key, std::span<float> out, int) override {
    const auto it = entries_.find(key);
    if (it == entries_.end()) return neverInitialised("pull", key);
    const auto& value = it->second.value;
    if (static_cast<std::int64_t>(out.size()) != value.numel()) {
      return inputError(fmt::format("pull of key {}: room for {} values, the key's has {}", key,
                                    out.size(), value.numel()));
    }
    std::copy_n(value.f32(), value.numel(), out.data());
    return {};
  }

  Status setOptimizer(const OptimizerSpec& o) override {
    if (Status s = updater_.set(o); !s) return s;
    for (auto& [key, e] : entries_)
      e.updates = {};
    return {};
  }

  Status setGradientCompression(const std::string& type, float threshold) override {
    auto spec = actors::compressionSpecOf(type, threshold);
    if (!spec) return spec.status();
    compression_ = spec.value();
    return {};
  }

  Status barrier() override { return {}; }

  Status saveOptimizerStates(const std::string& path) override {
    return actors::saveKeyStates(path, updater_, keyStates());
  }
  Status loadOptimizerStates(const std::string& path) override {
    return actors::loadKeyStates(path, *backend_, updater_, keyStates());
  }

 private:
  struct Entry {
    kernels::Tensor value;
    actors::KeyUpdates updates;
    std::vector<float> residual;  // 2bit
  };

  static Status neverInitialised(const char* what, int key) {
    return inputError(
        fmt::format("{} of key {}: the key was never initialised (init it first)", what, key));
  }

  std::vector<actors::KeyState> keyStates() {
    std::vector<actors::KeyState> keys;
    for (auto& [key, e] : entries_)
      keys.push_back({key, e.value.numel(), &e.updates});
    return keys;
  }

  // What the push would be after crossing the wire.
  void compress(Entry& e, kernels::Tensor& sum) {
    const auto n = sum.numel();
    if (e.residual.size() != static_cast<std::size_t>(n))
      e.residual.assign(static_cast<std::size_t>(n), 0.0f);
    const auto bytes = kernels::encode(compression_, sum.f32(), e.residual.data(), n);
    kernels::decode(compression_, bytes, sum.f32(), n, /*accumulate=*/false);
  }

  std::string type_;
  std::unique_ptr<kernels::Backend> backend_;
  std::map<int, Entry> entries_;
  actors::StoreUpdater updater_;
  kernels::CompressionSpec compression_;
};

}  // namespace

namespace actors {

Result<kernels::OptimizerSettings> optimizerOf(const OptimizerSpec& o) {
  for (const auto& [name, v] :
       {std::pair{"learning_rate", o.learning_rate}, {"rescale_grad", o.rescale_grad}}) {
    if (!std::isfinite(v) || v < 0) {
      return inputError(fmt::format("optimizer: {} {} is not a finite number >= 0", name, v));
    }
  }
  kernels::OptimizerSettings s;
  s.nesterov = o.nesterov;
  if (!kernels::setOptimizerName(s, o.name)) {
    return inputError(fmt::format("optimizer: unknown optimizer '{}' (known: {})", o.name,
                                  kernels::optimizerNames()));
  }
  s.momentum = o.momentum;
  s.weight_decay = o.weight_decay;
  s.beta1 = o.beta1;
  s.beta2 = o.beta2;
  s.epsilon = o.epsilon;
  s.rho = o.rho;
  s.eta = o.eta;
  try {
    kernels::check(s, 1);
  } catch (const Error& e) {
    return inputError(fmt::format("optimizer: {}", e.what()));
  }
  return s;
}

Status StoreUpdater::set(const OptimizerSpec& o) {
  auto settings = optimizerOf(o);
  if (!settings) return settings.status();
  spec_ = o;
  settings_ = settings.value();
  active_ = true;
  return {};
}

Status StoreUpdater::apply(kernels::Backend& backend, KeyUpdates& key, const kernels::Tensor& value,
                           const kernels::Tensor& sum, std::string_view what) const {
  if (!active_) {
    backend.copy(sum, value);
    return {};
  }
  if (!key.optimizer) key.optimizer = kernels::makeOptimizer(backend, value.numel(), settings_);
  if (spec_.rescale_grad != 1.0f) backend.scale(sum, spec_.rescale_grad);
  if (!key.optimizer->step(value, sum, spec_.learning_rate, ++key.updates)) {
    return {ErrorKind::kNumeric,
            fmt::format("{}: the update left inf or NaN in its value (learning rate {:g}; a "
                        "gradient was not finite, or too large)",
                        what, spec_.learning_rate)};
  }
  return {};
}

std::unique_ptr<kernels::Optimizer> StoreUpdater::make(kernels::Backend& backend,
                                                       std::int64_t size) const {
  return kernels::makeOptimizer(backend, size, settings_);
}

namespace {

constexpr char kStatesMagic[] = "TROUPEKVOPT1";

// The file's layout: the magic, the optimizer's name (its length first), the number of keys, then
// each key's number, size, update count, state rows and the rows' values (host order).
template <typename T>
void put(std::ofstream& out, const T& v) {
  out.write(reinterpret_cast<const char*>(&v), sizeof v);
}
template <typename T>
bool get(std::ifstream& in, T& v) {
  return static_cast<bool>(in.read(reinterpret_cast<char*>(&v), sizeof v));
}

}  // namespace

Status saveKeyStates(const std::string& path, const StoreUpdater& updater,
                     const std::vector<KeyState>& keys) {
  if (!updater.active()) {
    return inputError("save_optimizer_states: this store has no optimizer (set_optimizer first)");
  }
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    out.write(kStatesMagic, sizeof kStatesMagic - 1);
    put(out, static_cast<std::uint32_t>(updater.name().size()));
    out.write(updater.name().data(), static_cast<std::streamsize>(updater.name().size()));
    put(out, static_cast<std::uint32_t>(keys.size()));
    for (const KeyState& k : keys) {
      const kernels::Optimizer* opt = k.updates->optimizer.get();
      const auto rows = static_cast<std::uint32_t>(opt ? opt->states().size() : 0);
      put(out, static_cast<std::int32_t>(k.key));
      put(out, k.size);
      put(out, k.updates->updates);
      put(out, rows);
      if (rows > 0) {
        out.write(reinterpret_cast<const char*>(opt->state().f32()),
                  static_cast<std::streamsize>(sizeof(float) * rows * k.size));
      }
    }
    out.flush();
    if (!out) {
      std::remove(tmp.c_str());
      return {ErrorKind::kIo,
              fmt::format("save_optimizer_states: cannot write {}: {}", tmp, std::strerror(errno))};
    }
  }
  std::error_code error;
  std::filesystem::rename(tmp, path, error);
  if (error) {
    std::remove(tmp.c_str());
    return {ErrorKind::kIo, fmt::format("save_optimizer_states: cannot move {} to {}: {}", tmp,
                                        path, error.message())};
  }
  return {};
}

Status loadKeyStates(const std::string& path, kernels::Backend& backend,
                     const StoreUpdater& updater, const std::vector<KeyState>& keys) {
  const auto bad = [&](const std::string& why) {
    return inputError(fmt::format("load_optimizer_states: {}: {}", path, why));
  };
  if (!updater.active()) {
    return inputError(
        "load_optimizer_states: this store has no optimizer (set_optimizer first, the one the "
        "states were saved with)");
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return {ErrorKind::kIo,
            fmt::format("load_optimizer_states: cannot open {}: {}", path, std::strerror(errno))};
  }
  char magic[sizeof kStatesMagic - 1] = {};
  std::uint32_t name_size = 0, count = 0;
  if (!in.read(magic, sizeof magic) || std::memcmp(magic, kStatesMagic, sizeof magic) != 0) {
    return bad("not a file of save_optimizer_states");
  }
  if (!get(in, name_size) || name_size > 256) return bad("truncated");
  std::string name(name_size, '\0');
  if (!in.read(name.data(), name_size) || !get(in, count)) return bad("truncated");
  if (name != updater.name()) {
    return bad(
        fmt::format("the states are {}'s, and this store's optimizer is {}", name, updater.name()));
  }
  if (count != keys.size()) {
    return bad(fmt::format("it holds {} keys, and this store {}", count, keys.size()));
  }
  // Read whole before anything changes: a bad file leaves the store as it was.
  struct Saved {
    std::int64_t updates = 0;
    std::uint32_t rows = 0;
    std::vector<float> values;
  };
  std::vector<Saved> saved(keys.size());
  for (std::size_t i = 0; i < keys.size(); ++i) {
    std::int32_t key = 0;
    std::int64_t size = 0;
    Saved& s = saved[i];
    if (!get(in, key) || !get(in, size) || !get(in, s.updates) || !get(in, s.rows)) {
      return bad("truncated");
    }
    if (key != keys[i].key || size != keys[i].size) {
      return bad(fmt::format("its key {} of {} values is not this store's key {} of {}", key, size,
                             keys[i].key, keys[i].size));
    }
    const std::size_t rows = updater.settings().info().states.size();
    if (s.rows != 0 && s.rows != rows) {
      return bad(fmt::format("its key {} has {} state rows, and {} has {}", key, s.rows,
                             updater.name(), rows));
    }
    s.values.resize(static_cast<std::size_t>(s.rows) * static_cast<std::size_t>(size));
    if (!in.read(reinterpret_cast<char*>(s.values.data()),
                 static_cast<std::streamsize>(sizeof(float) * s.values.size()))) {
      return bad("truncated");
    }
  }
  for (std::size_t i = 0; i < keys.size(); ++i) {
    KeyUpdates& k = *keys[i].updates;
    const Saved& s = saved[i];
    k.optimizer.reset();
    k.updates = s.updates;
    if (s.rows == 0) continue;
    k.optimizer = updater.make(backend, keys[i].size);
    std::copy(s.values.begin(), s.values.end(), k.optimizer->state().f32());
  }
  return {};
}

Status checkInit(int key, std::size_t values, bool inited) {
  if (key < 0) return inputError(fmt::format("init of key {}: keys are >= 0", key));
  if (inited) return inputError(fmt::format("init of key {}: it has a value already", key));
  if (values == 0) return inputError(fmt::format("init of key {}: an empty value", key));
  return {};
}

Result<kernels::CompressionSpec> compressionSpecOf(const std::string& type, float threshold) {
  kernels::CompressionSpec spec;
  try {
    spec = {kernels::parseGradientCompression(type), threshold};
  } catch (const Error& e) {
    return inputError(e.what());
  }
  if (spec.type == kernels::GradientCompression::k2Bit &&
      !(threshold > 0 && std::isfinite(threshold))) {
    return inputError(fmt::format("gradient compression 2bit: threshold {} is not > 0", threshold));
  }
  return spec;
}

Status collectiveSizes(const char* what, std::size_t all, std::size_t mine, int workers) {
  if (all == mine * static_cast<std::size_t>(workers)) return {};
  return inputError(
      fmt::format("{}: {} values for {} workers of {} each", what, all, workers, mine));
}

Status partSizes(const char* what, const std::vector<std::span<float>>& parts, std::size_t mine,
                 int workers) {
  if (parts.size() != static_cast<std::size_t>(workers)) {
    return inputError(fmt::format("{}: {} arrays for {} workers", what, parts.size(), workers));
  }
  for (std::size_t w = 0; w < parts.size(); ++w) {
    if (parts[w].size() != mine) {
      return inputError(fmt::format("{}: array {} holds {} values, each worker's {}", what, w,
                                    parts[w].size(), mine));
    }
  }
  return {};
}

Status rootOf(const char* what, int root, int workers) {
  if (0 <= root && root < workers) return {};
  return inputError(fmt::format("{}: root {} is no worker (there are {}: 0 to {})", what, root,
                                workers, workers - 1));
}

}  // namespace actors

Status KVStore::push(const std::vector<int>& keys,
                     const std::vector<std::span<const float>>& values, int priority) {
  if (keys.size() != values.size()) {
    return inputError(fmt::format("push of {} keys with {} arrays", keys.size(), values.size()));
  }
  for (std::size_t i = 0; i < keys.size(); ++i) {
    if (Status s = push(keys[i], values[i], priority); !s) return s;
  }
  return {};
}

Status KVStore::pull(const std::vector<int>& keys, const std::vector<std::span<float>>& outs,
                     int priority) {
  if (keys.size() != outs.size()) {
    return inputError(fmt::format("pull of {} keys into {} arrays", keys.size(), outs.size()));
  }
  for (std::size_t i = 0; i < keys.size(); ++i) {
    if (Status s = pull(keys[i], outs[i], priority); !s) return s;
  }
  return {};
}

// Where the optimizer is not this process's: a distributed store's servers.
namespace {
Status statesNotHere(const char* what, const std::string& type) {
  return {ErrorKind::kInput,
          fmt::format("{}: a {} store's optimizer states are not kept here: its servers hold "
                      "them (MXNet's distributed stores refuse it too)",
                      what, type)};
}

Status noCollectives(const char* what, const std::string& type) {
  return inputError(
      fmt::format("{}: a {} store has no collectives: the ring store's (type 'ring') "
                  "run them without servers",
                  what, type));
}
}  // namespace

// The collectives of a store of one worker (copies); the stores of several override them.
Status KVStore::allreduce(std::span<float>) {
  if (numWorkers() != 1) return noCollectives("allreduce", type());
  return {};
}

Status KVStore::broadcast(std::span<float>, int root) {
  if (Status s = actors::rootOf("broadcast", root, numWorkers()); !s) return s;
  if (numWorkers() != 1) return noCollectives("broadcast", type());
  return {};
}

Status KVStore::allgather(std::span<const float> mine, std::span<float> all) {
  if (Status s = actors::collectiveSizes("allgather", all.size(), mine.size(), numWorkers()); !s)
    return s;
  std::vector<std::span<float>> parts;
  for (int w = 0; w < numWorkers(); ++w)
    parts.push_back(all.subspan(static_cast<std::size_t>(w) * mine.size(), mine.size()));
  return allgather(mine, parts);
}

Status KVStore::allgather(std::span<const float> mine, const std::vector<std::span<float>>& parts) {
  if (Status s = actors::partSizes("allgather", parts, mine.size(), numWorkers()); !s) return s;
  if (numWorkers() != 1) return noCollectives("allgather", type());
  std::copy(mine.begin(), mine.end(), parts[0].begin());
  return {};
}

Status KVStore::reduceScatter(std::span<const float> all, std::span<float> mine) {
  if (Status s = actors::collectiveSizes("reduce_scatter", all.size(), mine.size(), numWorkers());
      !s)
    return s;
  if (numWorkers() != 1) return noCollectives("reduce_scatter", type());
  std::copy(all.begin(), all.end(), mine.begin());
  return {};
}

Status KVStore::saveOptimizerStates(const std::string&) {
  return statesNotHere("save_optimizer_states", type());
}

Status KVStore::loadOptimizerStates(const std::string&) {
  return statesNotHere("load_optimizer_states", type());
}

Result<std::unique_ptr<KVStore>> KVStore::create(const std::string& type,
                                                 const KVStoreSettings& settings) {
  if (type == "local" || type == "device") return std::unique_ptr<KVStore>(new LocalKVStore(type));
  if (actors::isDistributedKVStore(type)) {
    try {
      return actors::makeDistKVStore(type, actors::loadTrainOptions("", settings));
    } catch (const std::exception& e) {
      return actors::statusOf(e);
    }
  }
  if (type == "ring") {
    try {
      return actors::makeRingKVStore(actors::loadTrainOptions("", settings));
    } catch (const std::exception& e) {
      return actors::statusOf(e);
    }
  }
  if (type == "dist_device_sync") {
    return inputError(
        "kvstore 'dist_device_sync' needs GPUs, and this build has none (dist_sync sums on the "
        "servers' CPUs)");
  }
  return inputError(fmt::format(
      "unknown kvstore type '{}' (MXNet's: local, device, dist_sync, dist_async; troupe's: ring, "
      "ssp)",
      type));
}

bool KVStore::isServer(const KVStoreSettings& settings) {
  try {
    return actors::loadTrainOptions("", settings).role == actors::ProcessRole::kServer;
  } catch (const std::exception&) {
    return false;  // create() or runServer() reports it
  }
}

Status KVStore::runServer(const std::string& type, const KVStoreSettings& settings) {
  if (!actors::isDistributedKVStore(type)) {
    return inputError(fmt::format(
        "runServer: kvstore '{}' has no servers (dist_sync, dist_async and ssp have)", type));
  }
  try {
    actors::serveKVStore(type, actors::loadTrainOptions("", settings));
  } catch (const std::exception& e) {
    return actors::statusOf(e);
  }
  return {};
}

}  // namespace troupe
