// Where every actor of a run is. Every process spawns the same actors in the same order, so each
// address follows from the run's plan (workers, servers, replicas a worker) and is known
// everywhere; actors name each other through this, by role and index, never by spawn order.
//   worker N (node N):    coordinator (the chief's, N = 0; a follower elsewhere), updater (or PS
//                         client), reducer, replica 0..R-1, reader 0..R-1
//   server S (node W+S):  server
// Names: "coordinator/N", "updater/N", "reducer/N", "replica/N/I", "reader/N/I", "server/S".
#pragma once

#include <cstdint>
#include <string>

#include "troupe/actor.h"

namespace troupe::actors {

class RunLayout {
 public:
  RunLayout(int workers, int servers, int replicas);

  int workers() const { return workers_; }
  int servers() const { return servers_; }
  int replicas() const { return replicas_; }

  static Address coordinator(int worker) { return at(worker, 0); }
  static Address updater(int worker) { return at(worker, 1); }
  static Address reducer(int worker) { return at(worker, 2); }
  static Address replica(int worker, int r) { return at(worker, 3 + r); }
  Address reader(int worker, int r) const { return at(worker, 3 + replicas_ + r); }
  Address server(int s) const { return at(workers_ + s, 0); }
  // The spawn order of a worker's actors ends here.
  std::uint32_t actorsPerWorker() const { return 3 + 2 * static_cast<std::uint32_t>(replicas_); }

  // The address of a name above; InputError naming it when the run has no such actor.
  Address find(const std::string& name) const;
  // The name of an address ("node N actor A" when it is none of the run's).
  std::string nameOf(Address address) const;

 private:
  static Address at(int node, int actor) {
    return Address{static_cast<std::uint32_t>(node), static_cast<std::uint32_t>(actor)};
  }
  int workers_, servers_, replicas_;
};

}  // namespace troupe::actors
