// What every KVStore type checks of its optimizer and gradient compression settings
// (troupe/kvstore.h), and the update rule of the stores that apply pushes themselves; defined in
// actors/kvstore/kvstore.cc.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "kernels/compression.h"
#include "kernels/optimizer.h"
#include "troupe/kvstore.h"

namespace troupe::actors {

// troupe's optimizer settings from MXNet's (nag: sgd with nesterov); kInput naming the bad one
// (an unknown optimizer, with the known ones; a learning rate or rescale_grad not finite and
// >= 0; a setting out of the optimizer's range).
Result<kernels::OptimizerSettings> optimizerOf(const OptimizerSpec& optimizer);

// A key's optimizer state in a store that applies its pushes itself (local, device, ring).
struct KeyUpdates {
  std::unique_ptr<kernels::Optimizer> optimizer;  // made at the key's first update
  std::int64_t updates = 0;                       // by it (Adam's bias correction counts them)
};

// set_optimizer's rule in such a store: none, where a push's sum becomes the value (MXNet's store
// without an updater), or an optimizer with MXNet's learning rate and rescale_grad.
class StoreUpdater {
 public:
  bool active() const { return active_; }
  const std::string& name() const { return settings_.name(); }
  const kernels::OptimizerSettings& settings() const { return settings_; }
  // The optimizer of a key of `size` values (active() only), with no state yet.
  std::unique_ptr<kernels::Optimizer> make(kernels::Backend& backend, std::int64_t size) const;
  // The rule from now on; kInput as optimizerOf, and the rule unchanged. The store starts each
  // key's KeyUpdates anew (a new optimizer starts with no state).
  Status set(const OptimizerSpec& optimizer);
  // Applies `sum` (rescaled in place) to `value` on `backend`; kNumeric naming `what` ("push of
  // key 3") when the update left inf or NaN in the value.
  Status apply(kernels::Backend& backend, KeyUpdates& key, const kernels::Tensor& value,
               const kernels::Tensor& sum, std::string_view what) const;

 private:
  OptimizerSpec spec_;
  kernels::OptimizerSettings settings_;
  bool active_ = false;
};

// A key whose optimizer state a store saves or loads (save_optimizer_states): its number, its
// value's size and its updates.
struct KeyState {
  int key = 0;
  std::int64_t size = 0;
  KeyUpdates* updates = nullptr;
};
// The optimizer's name, then each key's update count and state rows, to `path` (through a
// temporary file renamed over it: whole or not at all); kInput without an optimizer, kIo naming
// the file.
Status saveKeyStates(const std::string& path, const StoreUpdater& updater,
                     const std::vector<KeyState>& keys);
// Back: the file must name the updater's optimizer and hold exactly `keys`, of their sizes; a key
// that had updates gets its optimizer (made on `backend`) with the saved state and count.
Status loadKeyStates(const std::string& path, kernels::Backend& backend,
                     const StoreUpdater& updater, const std::vector<KeyState>& keys);

// init()'s checks of every type: a key >= 0, not inited yet (`inited`), a value of some size.
Status checkInit(int key, std::size_t values, bool inited);

// "none", "fp16", "bf16" or "2bit" (threshold > 0); kInput naming the bad one.
Result<kernels::CompressionSpec> compressionSpecOf(const std::string& type, float threshold);

// A collective's sizes (KVStore::allgather, reduceScatter): `all` is `workers` times `mine`, else
// kInput naming both.
Status collectiveSizes(const char* what, std::size_t all, std::size_t mine, int workers);
// The same for a collective's `parts`, one array a worker.
Status partSizes(const char* what, const std::vector<std::span<float>>& parts, std::size_t mine,
                 int workers);
// A collective's root (KVStore::broadcast): one of the workers, else kInput naming it.
Status rootOf(const char* what, int root, int workers);

}  // namespace troupe::actors
