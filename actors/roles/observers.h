// The chief's side of a run's observers (troupe/observer.h): who subscribed to the weights, and
// every how many steps. The updater (or the PS client) offers the weights after each step; an
// observer that is gone is dropped, and the run goes on.
#pragma once

#include <cstdint>
#include <vector>

#include "kernels/tensor.h"
#include "troupe/actor.h"

namespace troupe::actors {

class Observers {
 public:
  void add(Address observer, std::int64_t every);
  bool empty() const { return subscribers_.empty(); }
  // Sends a copy of `weights` (the weights after `step` steps) to each observer due at `step`
  // (`last`: the run's last step, due to all) through `send`; one that cannot be reached any
  // more is dropped, with a line in the log.
  template <typename Send>
  void offer(std::int64_t step, bool last, const kernels::Tensor& weights, Send&& send) {
    kernels::Tensor copy;
    bool copied = false;
    for (auto it = subscribers_.begin(); it != subscribers_.end();) {
      if (!last && step % it->every != 0) {
        ++it;
        continue;
      }
      if (!copied) {
        copy = hostCopy(weights);
        copied = true;
      }
      if (!deliver(*it, step, copy, send)) {
        it = subscribers_.erase(it);
      } else {
        ++it;
      }
    }
  }

 private:
  struct Subscriber {
    Address address;
    std::int64_t every = 1;
  };
  static kernels::Tensor hostCopy(const kernels::Tensor& weights);
  static void dropped(const Subscriber& s, const char* why);

  template <typename Send>
  static bool deliver(const Subscriber& s, std::int64_t step, const kernels::Tensor& weights,
                      Send& send) {
    try {
      send(s.address, step, weights);
      return true;
    } catch (const std::exception& e) {
      dropped(s, e.what());
      return false;
    }
  }

  std::vector<Subscriber> subscribers_;
};

}  // namespace troupe::actors
