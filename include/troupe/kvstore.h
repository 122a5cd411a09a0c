// A key-value store with MXNet's semantics (mx.kv): what data-parallel loops written by hand use.
// Keys are integers, values float32 arrays whose size init() fixes.
//
//   auto kv = troupe::KVStore::create("local");
//   kv.value()->init(3, weights);                          // the key's value
//   kv.value()->setOptimizer({.learning_rate = 0.1f});     // or none: the push becomes the value
//   kv.value()->push(3, gradient);                         // the optimizer applies it
//   kv.value()->pull(3, weights);                          // the updated value
//
// Types (MXNet's names): "local" — one process: each push (the sum of the arrays pushed together,
// as from several devices) is applied to the key's value at once, by the optimizer if one is set,
// else it replaces the value; a pull reads the value. With gradient compression, each push is
// encoded and decoded as it would cross the wire (2bit keeps its residual per key). "device",
// "dist_sync", "dist_async", "ring" and "ssp" are not in this build yet: create() says so.
// Every call answers with a Status; none throws.
#pragma once

#include <memory>
#include <span>
#include <string>
#include <vector>

#include "troupe/status.h"

namespace troupe {

// SGD with PyTorch's semantics (troupe's optimizer): g' = rescale_grad * g + weight_decay * w;
// v = momentum * v + g'; w -= learning_rate * v (nesterov: w -= lr * (g' + momentum * v)).
struct OptimizerSpec {
  std::string name = "sgd";
  float learning_rate = 0.01f;
  float momentum = 0.0f;
  float weight_decay = 0.0f;
  float rescale_grad = 1.0f;  // MXNet's: 1 / batch size when gradients are sums
  bool nesterov = false;
};

class KVStore {
 public:
  static Result<std::unique_ptr<KVStore>> create(const std::string& type);
  virtual ~KVStore() = default;

  // The store's type, this worker's rank and the number of workers (MXNet's kv.type, kv.rank,
  // kv.num_workers).
  virtual std::string type() const = 0;
  virtual int rank() const = 0;
  virtual int numWorkers() const = 0;

  // Gives `key` its first value. A key is initialised once.
  virtual Status init(int key, std::span<const float> value) = 0;
  // Pushes the sum of `values` (one or several arrays of the key's size) for `key`. `priority`
  // orders pushes waiting to go out in a distributed store (higher first); local ones apply in
  // the order of the calls.
  virtual Status push(int key, const std::vector<std::span<const float>>& values,
                      int priority = 0) = 0;
  Status push(int key, std::span<const float> value, int priority = 0) {
    return push(key, std::vector<std::span<const float>>{value}, priority);
  }
  // Copies the key's value into `out` (its size).
  virtual Status pull(int key, std::span<float> out, int priority = 0) = 0;
  // push, then pull into `out`.
  Status pushpull(int key, std::span<const float> value, std::span<float> out, int priority = 0) {
    if (Status s = push(key, value, priority); !s) return s;
    return pull(key, out, priority);
  }

  virtual Status setOptimizer(const OptimizerSpec& optimizer) = 0;
  // "none", "fp16", "bf16" or "2bit" (with `threshold`), as `troupe train
  // --gradient_compression`.
  virtual Status setGradientCompression(const std::string& type, float threshold = 0.5f) = 0;
  // Waits for every worker (a local store has one).
  virtual Status barrier() = 0;
};

}  // namespace troupe
