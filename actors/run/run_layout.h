// The run's topology (troupe/topology.h) for the code inside troupe, where counts that no run has
// and names that are none of its actors are bad settings to throw: every process spawns the same
// actors in the same order, so each address follows from the run's plan and is known everywhere;
// actors name each other through this, by role and index, never by spawn order.
#pragma once

#include <string>
#include <utility>

#include "actors/core/status_of.h"
#include "troupe/topology.h"

namespace troupe::actors {

class RunLayout : public Topology {
 public:
  // InputError when no run has these counts.
  RunLayout(int workers, int servers, int replicas)
      : Topology(orThrow(Topology::create(workers, servers, replicas))) {}

  // InputError naming `name` when the run has no such actor.
  Address find(const std::string& name) const { return orThrow(Topology::find(name)); }

 private:
  template <typename T>
  static T orThrow(Result<T> r) {
    throwIfError(r.status());
    return std::move(r.value());
  }
};

}  // namespace troupe::actors
