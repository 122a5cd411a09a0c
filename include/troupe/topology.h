// Where every actor of a training run is, by role and index. The run's plan (workers, servers,
// replicas a worker) gives it, and every process of the run derives the same one, so an actor
// anywhere in the run is found by its name, never by the order it was spawned in:
//   worker W (node W):    coordinator/W, updater/W (the PS client under a parameter-server
//                         schedule), reducer/W, replica/W/I for I < replicas, stage/W (what
//                         other processes' pipeline stages send to its own: pipeline_across
//                         processes; idle otherwise), reader/W/I for I < replicas
//   server S (node W+S):  server/S
// Worker 0 is the chief: its coordinator drives the run.
//
//   auto topology = trainer.topology();            // troupe/trainer.h
//   auto reader = topology->find("reader/0/1");    // an Address, or kInput naming the name
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "troupe/actor.h"
#include "troupe/status.h"

namespace troupe {

class Topology {
 public:
  using Address = actors::Address;

  // kInput naming the counts when a run cannot have them (no worker, no replica, servers < 0).
  static Result<Topology> create(int workers, int servers, int replicas);

  int workers() const { return workers_; }
  int servers() const { return servers_; }
  int replicas() const { return replicas_; }  // a worker

  // The actors of worker `worker`, by role; the first three are the same in every run.
  static Address coordinator(int worker);
  static Address updater(int worker);
  static Address reducer(int worker);
  static Address replica(int worker, int r);
  Address reader(int worker, int r) const;
  Address stage(int worker) const;
  Address server(int s) const;
  // How many actors a worker spawns (a server spawns one).
  std::uint32_t actorsPerWorker() const;

  // The address of a name above; kInput naming it, and the names there are, when the run has no
  // such actor.
  Result<Address> find(const std::string& name) const;
  // The name of an address ("node N actor A" when it is none of the run's).
  std::string nameOf(Address address) const;
  // Every actor's name, worker by worker, then the servers.
  std::vector<std::string> names() const;

 private:
  Topology(int workers, int servers, int replicas)
      : workers_(workers), servers_(servers), replicas_(replicas) {}
  int workers_, servers_, replicas_;
};

}  // namespace troupe
