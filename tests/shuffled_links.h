// Links between N ranks in one thread, for collective tests: messages wait in a queue per link
// and are delivered in a shuffled order across links, in order per link (as a transport is), to
// shake out ordering assumptions.
#pragma once

#include <deque>
#include <functional>
#include <random>
#include <vector>

namespace troupe::testing {

template <typename Message>
class ShuffledLinks {
 public:
  ShuffledLinks(std::size_t links, unsigned seed) : rng_(seed), queues_(links) {}

  void push(std::size_t link, Message m) { queues_.at(link).push_back(std::move(m)); }

  // Delivers until every queue is empty (deliveries may queue more), calling deliver(link, m).
  void deliverAll(const std::function<void(std::size_t link, Message m)>& deliver) {
    for (;;) {
      std::vector<std::size_t> busy;
      for (std::size_t i = 0; i < queues_.size(); ++i) {
        if (!queues_[i].empty()) busy.push_back(i);
      }
      if (busy.empty()) return;
      const auto i = busy[rng_() % busy.size()];
      Message m = std::move(queues_[i].front());
      queues_[i].pop_front();
      deliver(i, std::move(m));
    }
  }

 private:
  std::mt19937 rng_;
  std::vector<std::deque<Message>> queues_;
};

}  // namespace troupe::testing
