// Rendezvous steps built on any Store, for the ranks of a run.
//
// Each uses keys under `name` and is meant to run once per name in a store: run several with
// different names, or give each run its own prefix store (prefix_store.h). Any thread may call
// them; each rank calls with its own rank.
#pragma once

#include <chrono>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "rendezvous/store.h"

namespace troupe::rendezvous {

// Publishes `my_value` (e.g. this rank's address) under "<name>/<rank>" and returns every rank's
// value, in rank order, once all `world_size` ranks have published. When `timeout` runs out first
// throws TimeoutError naming the missing ranks: "rendezvous 'addresses' timed out after 5 s waiting
// for ranks 2, 3 of 4 (tcp store 10.0.0.1:29500)"; with `who`, by what each rank is too ("waiting
// for worker 1, server 0 (ranks 1, 2 of 3)"). InputError unless 0 <= rank < world_size.
std::vector<std::string> exchange(Store& store, int rank, int world_size, std::string_view my_value,
                                  std::chrono::milliseconds timeout,
                                  std::string_view name = "exchange",
                                  const std::function<std::string(int rank)>& who = {});

// Returns once all `world_size` ranks have called barrier with the same `name`; TimeoutError
// naming the ranks that did not arrive otherwise. InputError unless 0 <= rank < world_size.
// With `gone`, asked every 100 ms about each rank not there yet: a reason (non-empty) says that
// rank never comes (it is known to have failed), and the wait ends at once with an Error naming
// it and why, not after `timeout`.
void barrier(Store& store, std::string_view name, int rank, int world_size,
             std::chrono::milliseconds timeout,
             const std::function<std::string(int rank)>& gone = {});

}  // namespace troupe::rendezvous
