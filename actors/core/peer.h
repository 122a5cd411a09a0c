// The other processes of a run, named as the user knows them: by role and rank ("worker 1",
// "server 0") and, once the processes have met, by address; never by transport node id alone.
//
// A wait on a peer that runs out (a hung or vanished process) throws PeerError. It travels through
// the actor system to runTraining, which prints its culprit line on stderr for the launcher:
//   troupe-culprit: server 0: no pull answer for step 12 within 60 s (peer_timeout)
#pragma once

#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "troupe/error.h"

namespace troupe::actors {

struct Peer {
  std::string role;     // "worker" or "server"
  int rank = 0;         // among the processes of its role
  std::string address;  // "HOST:PORT" of its transport; empty: not known

  // "server 0", or "server 0 at 10.0.0.2:41000" when the address is known.
  std::string str() const;
};

// Another process of the run is hung or gone. what() is the whole story, as the process that
// noticed tells it; peer() and reason() make the culprit line.
class PeerError : public Error {
 public:
  PeerError(Peer peer, std::string reason, const std::string& what)
      : Error(what), peer_(std::move(peer)), reason_(std::move(reason)) {}
  const Peer& peer() const { return peer_; }
  // One clause without the peer's name: "no pull answer for step 12 within 60 s (peer_timeout)".
  const std::string& reason() const { return reason_; }
  // "troupe-culprit: server 0: <reason>" (role and rank only: the launcher's summary matches them).
  std::string culpritLine() const;

 private:
  Peer peer_;
  std::string reason_;
};

// Calls `visit` on `error`, then on the exceptions nested in it (std::nested_exception, as
// Runtime::run throws them), outermost first, until `visit` returns true. Returns whether it
// did. The exceptions live only while `visit` runs.
bool visitNested(const std::exception& error,
                 const std::function<bool(const std::exception&)>& visit);

// The PeerError in `error` or in the exceptions nested in it, if there is one.
std::optional<PeerError> findPeerError(const std::exception& error);

// Who the transport nodes of a run are: workers 0 .. W-1, then servers W .. W+S-1 (trainer.cc
// numbers them so). Addresses are filled in once the processes have met, before any actor runs;
// after that the object is only read (any thread).
class RunMembers {
 public:
  RunMembers(int workers, int servers) : workers_(workers), servers_(servers) {}
  int workers() const { return workers_; }
  int servers() const { return servers_; }
  // The peer of a node id; an id outside the run reads "node N".
  Peer ofNode(std::uint32_t node) const;
  Peer worker(int rank) const { return ofNode(static_cast<std::uint32_t>(rank)); }
  Peer server(int rank) const { return ofNode(static_cast<std::uint32_t>(workers_ + rank)); }
  // Per node id, as the transport advertises it ("tcp://HOST:PORT;unix://..."); the TCP part is
  // kept.
  void setAddresses(const std::vector<std::string>& transport_addresses);
  // The role and rank of a node, with the address given (as the transport advertises it): reads
  // only the layout, so any thread may call it at any time, also while addresses are set.
  Peer ofNode(std::uint32_t node, const std::string& transport_address) const;

 private:
  Peer roleOf(std::uint32_t node) const;

  int workers_;
  int servers_;
  std::vector<std::string> addresses_;
};

// A link to another process lost after the processes met (it exited, hung, or the link was cut):
// what the cluster's peer-lost handler fails the run with. what(): "lost the link to worker 1 at
// 10.0.0.2:41000: <why>"; culprit line "troupe-culprit: worker 1: lost the link (<why>)".
PeerError lostLinkError(const Peer& peer, const std::string& why);

// Shared by the actors of a process that name peers; null: names without addresses.
using RunMembersPtr = std::shared_ptr<const RunMembers>;

// The worker or server of that rank, with its address when `members` know it.
Peer peerOf(const RunMembersPtr& members, const std::string& role, int rank);

// Observers' node ids start here: above any run's workers and servers.
inline constexpr std::uint32_t kObserverNodeBase = 1u << 20;

inline bool isObserverNode(std::uint32_t node) {
  return node >= kObserverNodeBase;
}

// The run's store key under which the chief says where observers find the weights:
// "ACTOR STEPS_PER_EPOCH FIRST_STEP LAST_STEP NUM_PARAMS ADDRESS" (ACTOR of node 0; ADDRESS its
// transport's). Observers count themselves under kObserversKey (their node: base + count - 1).
inline constexpr const char* kObserveKey = "observe";
inline constexpr const char* kObserversKey = "observers";

}  // namespace troupe::actors
