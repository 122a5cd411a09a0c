// This process's membership in a multi-process run: the rendezvous store, the transport to every
// other process, and the bridge that lets actors send to any Address.
//
// join() opens the store (rank 0 serves the embedded TCP store itself when asked to), starts the
// transport, publishes this process's address under the run id and waits for every other
// process's, then links to all of them. A process that never shows up ends the wait with a
// TimeoutError naming the missing ranks; a link lost later fails the actor system, naming the node.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "actors/core/system.h"

namespace troupe::rendezvous {
class Store;
}

namespace troupe::actors {

class Trace;

struct ClusterOptions {
  int rank = 0;   // this process's node id
  int world = 1;  // processes in the run
  std::string run_id;
  std::string rendezvous;    // a store URL (rendezvous/url.h: storeBackends())
  bool serve_store = false;  // rank 0 serves the tcp:// store itself (started by hand)
  std::string interface;     // network interface to listen on; empty: TROUPE_INTERFACE or any
  // The run's secret (transport/auth.h): links and the embedded store refuse whoever lacks it.
  // Empty: they check the run id only (a warning says so).
  std::string secret;
  // TCP connections to each peer on another host (transport::TransportOptions::
  // connectionsPerPeer): ring chunks spread over them.
  int connections_per_peer = 1;
  std::chrono::milliseconds timeout{60000};
  // A link with nothing, not even a heartbeat, for this long is lost (transport's peerTimeout).
  std::chrono::milliseconds peer_timeout{60000};
  Trace* trace = nullptr;  // send and receive spans
  // A link to another process lost after the join (it exited, hung, or the link was cut): called
  // on a transport thread with the node, the address it advertised and why. Unset: the system
  // fails with "lost the link to node N".
  std::function<void(int node, const std::string& address, const std::string& why)> on_peer_lost;
  // What a node is ("worker 1", "server 0"), for the error of a rendezvous some never reached;
  // unset: nodes are named by their rank.
  std::function<std::string(int node)> name_of;
};

class Cluster {
 public:
  virtual ~Cluster() = default;
  virtual rendezvous::Store& store() = 0;
  // The transport address each process advertised, by node.
  virtual const std::vector<std::string>& addresses() const = 0;
  // The Runtime's RemoteSend. Any thread.
  virtual void send(Address from, Address to, std::unique_ptr<Envelope> message) = 0;
  // Runtime's RemoteBuffer (the transport's sharedBuffer: undefined when `to` shares no
  // memory with this process). Any thread.
  virtual kernels::Tensor sharedBuffer(Address to, kernels::Shape shape) = 0;
  // Waits until every process reached `name` (TimeoutError naming who did not).
  virtual void barrier(const std::string& name) = 0;
  // The last call of a run: a barrier, after which rank 0 (which may serve the store) waits until
  // every other process is done with the store too.
  virtual void finish() = 0;
};

// Messages from other processes are delivered into `system`, whose actors must all be spawned
// already (they may not have started).
std::unique_ptr<Cluster> joinCluster(const ClusterOptions& options, Runtime& system);

// The run's incarnation as read from its store by `who`: 16 hex digits, or an InputError naming
// the key and its bytes escaped (a poisoned store, a process of another troupe).
std::string checkedIncarnation(std::string text, const std::string& who);

}  // namespace troupe::actors
