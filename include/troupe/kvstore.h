// A key-value store with MXNet's semantics (mx.kv): what data-parallel loops written by hand use.
// Keys are integers >= 0, values float32 arrays whose size init() fixes.
//
//   if (troupe::KVStore::isServer()) return troupe::KVStore::runServer("dist_sync") ? 0 : 1;
//   auto kv = troupe::KVStore::create("dist_sync");        // or "local"
//   kv.value()->init(3, weights);                          // the key's value
//   kv.value()->setOptimizer({.learning_rate = 0.1f});     // or none: the push becomes the value
//   kv.value()->push(3, gradient);                         // the optimizer applies it
//   kv.value()->pull(3, weights);                          // the updated value
//
// Types (MXNet's names):
//  - "local", "device": one process. Each push (the sum of the arrays pushed together, as from
//    several devices) is applied to the key's value at once, by the optimizer if one is set, else
//    it replaces the value; a pull reads the value. The arrays are host memory: "device" sums on
//    the CPU as "local" does (`troupe train --schedule device` sums GPU replicas on a GPU). With
//    gradient compression, each push is encoded and decoded as it would cross the wire (2bit keeps
//    its residual per key).
//  - "dist_sync", "dist_async", and troupe's "ssp": workers and parameter-server processes, placed
//    as `troupe train` places them: `troupe launch -n W -s S -- PROGRAM` (any launcher), MXNet's
//    tools/launch.py (DMLC_* variables), or `settings`. A key's values live on the servers (a key
//    of at least 1,000,000 values is cut across all of them, as MXNet's bigarray_bound; a smaller
//    one lives on server key % S). init() on worker 0 gives the value and every worker waits for
//    it; setOptimizer and setGradientCompression on worker 0 set the servers' (every worker must
//    call them: the others wait for worker 0's). push() returns once the push is on its way;
//    pull() waits for the value:
//      dist_sync:  the servers sum the n-th push of a key from every worker, then update the key
//                  once; a worker's pull after its n-th push waits for that update.
//      dist_async: the servers apply each push as it arrives (an optimizer is needed); a pull
//                  answers at once, with the worker's own pushes applied.
//      ssp:        as dist_async, but a pull after a worker's n-th push of a key waits until
//                  every worker pushed it n - staleness times (setting "staleness", default 2).
//    Servers run runServer(), which returns once every worker's store is gone. A wait for a
//    server or a worker that is gone or hung ends after peer_timeout with kPeer or kTimeout
//    naming it.
//  - "ring" (troupe's): no servers, every process a worker (`troupe launch -n W -- PROGRAM`). Each
//    worker keeps every key's value; a push is summed over all workers by ring allreduce (the
//    trainer's, bitwise the same sum everywhere) and applied by each worker to its own copy with
//    the same optimizer, so the copies stay equal: dist_sync's results without servers. init() is
//    worker 0's value broadcast the same way; a pull applies this worker's pushes of the key as
//    their sums come in. setGradientCompression goes before the first push.
// Every call answers with a Status; none throws.
#pragma once

#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "troupe/settings.h"
#include "troupe/status.h"

namespace troupe {

// The update a store applies to pushes (MXNet's set_optimizer), by name, with PyTorch's
// semantics: any optimizer troupe has (`troupe info` lists them), or MXNet's nag (sgd with
// nesterov). sgd: g' = rescale_grad * g + weight_decay * w; v = momentum * v + g';
// w -= learning_rate * v (nesterov: w -= lr * (g' + momentum * v)). Each reads the fields it
// names; the gradient is always multiplied by rescale_grad first. Every key
// has its own state (and update count, for Adam's bias correction), started anew when
// setOptimizer is called again with other settings.
struct OptimizerSpec {
  std::string name = "sgd";
  float learning_rate = 0.01f;
  float momentum = 0.0f;
  float weight_decay = 0.0f;
  float rescale_grad = 1.0f;  // MXNet's: 1 / batch size when gradients are sums
  bool nesterov = false;
  float beta1 = 0.9f, beta2 = 0.999f;  // adam, adamw, lamb
  float epsilon = 0.0f;                // 0: the optimizer's default (1e-8 for Adam)
  float rho = 0.9f;                    // rmsprop: the squares' decay (MXNet's gamma1)
  float eta = 0.001f;                  // lars: the trust coefficient
};

// Config keys of `troupe train` (docs/config.md) that place a distributed store's process, over
// the launcher's variables: role, shard_id, num_shards (workers), num_servers, rendezvous,
// run_id, secret_file, interface, staleness, peer_timeout, rendezvous_timeout, threads ...
using KVStoreSettings = Settings;

class KVStore {
 public:
  static Result<std::unique_ptr<KVStore>> create(const std::string& type,
                                                 const KVStoreSettings& settings = {});
  // Whether this process was started as a parameter server (TROUPE_ROLE=server, DMLC_ROLE=server,
  // or settings' role): then it serves with runServer() instead of create(). MXNet's C++
  // package: KVStore::GetRole().
  static bool isServer(const KVStoreSettings& settings = {});
  // Serves this process's share of the keys of a distributed store of `type` until every worker's
  // store is gone (MXNet's KVStore::RunServer).
  static Status runServer(const std::string& type, const KVStoreSettings& settings = {});
  // A distributed worker's store, when destroyed, tells the servers this worker is done and waits
  // (up to rendezvous_timeout) for the run's other processes to be done too; what fails there is
  // logged.
  virtual ~KVStore() = default;

  // The store's type, this worker's rank and the number of workers (MXNet's kv.type, kv.rank,
  // kv.num_workers).
  virtual std::string type() const = 0;
  virtual int rank() const = 0;
  virtual int numWorkers() const = 0;

  // Gives `key` its first value. A key is initialised once.
  virtual Status init(int key, std::span<const float> value) = 0;
  // Pushes the sum of `values` (one or several arrays of the key's size) for `key`. `priority` is
  // MXNet's hint for ordering pushes that wait to go out; troupe's stores apply (local) or send
  // (distributed) each push at once, in the order of the calls, so nothing waits to be reordered.
  virtual Status push(int key, const std::vector<std::span<const float>>& values,
                      int priority = 0) = 0;
  Status push(int key, std::span<const float> value, int priority = 0) {
    return push(key, std::vector<std::span<const float>>{value}, priority);
  }
  // Copies the key's value into `out` (its size).
  virtual Status pull(int key, std::span<float> out, int priority = 0) = 0;
  // Several keys at once, one array each (MXNet's list forms): a distributed store sends them
  // together (the keys that a server holds side by side, as inited one after the other, in one
  // message) and, for the pull, waits for all the answers at once.
  virtual Status push(const std::vector<int>& keys,
                      const std::vector<std::span<const float>>& values, int priority = 0);
  virtual Status pull(const std::vector<int>& keys, const std::vector<std::span<float>>& outs,
                      int priority = 0);
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
  // Collectives of troupe's own (not MXNet's), for frameworks that run their own optimizer (the
  // torch.distributed backend): every worker calls them in the same order with the same sizes.
  // allreduce: `values` becomes their sum over the workers, in place (no key, no optimizer: every
  // worker ends with bitwise the same sum). allgather: `all` (numWorkers() times the size of
  // `mine`) gets every worker's `mine`, in rank order. reduceScatter: `mine` gets the sum over the
  // workers of their `all`'s rank-th part. The ring store runs each on a ring of its own (an
  // allgather or a reduce-scatter moves each part once around, an allreduce twice); a store of
  // one worker copies; the distributed stores refuse (kInput). allgather into `parts`: worker w's
  // `mine` into parts[w] (one array a worker, each of mine's size: torch.distributed's all_gather
  // into a list), written where they lie. broadcast: every worker's `values` become worker
  // `root`'s, bit for bit (its bytes pass along the ring from the root, once over each link but
  // the one into the root; kInput naming a root that is no worker).
  virtual Status allreduce(std::span<float> values);
  virtual Status broadcast(std::span<float> values, int root);
  Status allgather(std::span<const float> mine, std::span<float> all);
  virtual Status allgather(std::span<const float> mine, const std::vector<std::span<float>>& parts);
  virtual Status reduceScatter(std::span<const float> all, std::span<float> mine);
  // MXNet's save_optimizer_states / load_optimizer_states: the optimizer's name and every key's
  // update count and state (Adam's exp_avg and exp_avg_sq, say) to a file, written whole or not
  // at all, and back into a store with the same optimizer and keys. Local, device and ring
  // stores, whose optimizer runs here (a ring's worker saves its own copy, after its pushes are
  // applied); a distributed store's runs on its servers (kInput, as MXNet's refuses). kInput
  // naming what differs (the optimizer, a key, a size), kIo naming the file.
  virtual Status saveOptimizerStates(const std::string& path);
  virtual Status loadOptimizerStates(const std::string& path);
};

}  // namespace troupe
