// The actor system: runs actors on Asio executors and delivers their messages.
//
// Mailboxes are bounded. A send to a full mailbox never blocks a thread: the message waits in the
// sender's outbox and the sender takes no new message until the receiver has room again, so a slow
// actor slows its producers down instead of growing a queue (backpressure). An actor's sends to
// itself are not bounded (it would wait for itself), nor is a send from outside any actor to the
// actor whose work runs it, on that actor's thread (a callback of its own, as a leased chunk's
// release when the transport copied it). Other senders outside any actor (main, the transport's
// threads) block until there is room, up to SystemOptions::external_send_timeout.
// Actors on the shared pool run on strands of one io_context; an actor spawned with
// a thread name runs on that thread, shared with the other actors given the same name (compute
// actors, whose OpenMP teams should stay put and not compete with each other for cores).
// Addresses name a node; a send to another node goes to SystemOptions::remote (the transport);
// messages arriving from other nodes come in through deliver() with the remote sender's address.
// Thread safety: every method may be called from any thread.
#pragma once

#include <chrono>
#include <cstddef>
#include <exception>
#include <functional>
#include <memory>
#include <string>
#include <type_traits>

#include "kernels/tensor.h"
#include "troupe/actor.h"

namespace troupe::actors {

// Carries a message to an actor of another node (the transport, through the wire codec). Called on
// the sender's thread; must not block for long.
using RemoteSend = std::function<void(Address from, Address to, std::unique_ptr<Envelope> message)>;
// Shared memory for a float tensor about to be sent to an actor of another node on this host (the
// transport's sharedBuffer); an undefined tensor when there is none.
using RemoteBuffer = std::function<kernels::Tensor(Address to, kernels::Shape shape)>;

// Runs a task on an executor of the caller's (an Asio io_context's post, a thread pool's submit):
// any thread, in any order; the system keeps each actor's handlers one at a time.
using Executor = std::function<void(std::function<void()> task)>;

struct SystemOptions {
  std::uint32_t node = 0;
  // Set: actors spawned without a thread name run on it, not on the system's pool (whose
  // threads then only fire timers).
  Executor executor;
  RemoteSend remote;           // empty: sends to other nodes are errors
  RemoteBuffer remote_buffer;  // empty: sharedBuffer gives none
  int pool_threads = 2;
  std::size_t mailbox_capacity = 64;
  std::chrono::milliseconds external_send_timeout{30000};
};

struct SpawnOptions {
  // Non-empty: run on the thread of this name (made at the first spawn naming it), not the pool.
  std::string thread;
  // The actor's handlers run on the thread that delivers its message (the transport's, for one
  // from another process; a local sender's), one at a time as ever, sparing a thread's wake-up
  // per message; started() and what arrives while a handler of it runs on that thread go to the
  // pool. Only for handlers that are short and never block: they hold up the deliverer.
  bool inline_handlers = false;
  // 0: SystemOptions::mailbox_capacity.
  std::size_t mailbox_capacity = 0;
};

class Runtime {
 public:
  virtual ~Runtime() = default;

  // Takes ownership. The actor starts (started() runs on its executor, before any message) when
  // run() is called, or at once if run() is already running; so a process can spawn all of its
  // actors, in any order, before any of them sends a message.
  virtual Address spawn(std::unique_ptr<Actor> actor, SpawnOptions options = {}) = 0;

  template <typename A, typename... Args>
  Address spawn(SpawnOptions options, Args&&... args) {
    static_assert(std::is_base_of_v<Actor, A>);
    return spawn(std::make_unique<A>(std::forward<Args>(args)...), options);
  }

  // Sends from outside any actor (blocks while the mailbox is full, up to the timeout).
  template <typename M>
  void tell(Address to, M message) {
    deliver(Address{options().node, kNoActor}, to, std::make_unique<Typed<M>>(std::move(message)));
  }

  // Memory for a float tensor that will be sent, unchanged after the send, to `to`, shared with
  // `to`'s process: undefined (raw() null) when `to` is in this process or shares no memory with
  // it. See leasedView and sendable (actors/core/lease.h) for what to send then.
  kernels::Tensor sharedBuffer(Address to, kernels::Shape shape) const;

  // Delivers message to `to` after `delay` (a timer; the sender is the system).
  template <typename M>
  void after(std::chrono::milliseconds delay, Address to, M message) {
    deliverAfter(delay, to, std::make_unique<Typed<M>>(std::move(message)));
  }

  // Starts the actors spawned so far, then blocks until shutdown() or a failure; a failure (an
  // actor's handler threw, a send timed out) is rethrown as troupe::Error naming the actor and the
  // message type, with the exception that caused it nested (std::throw_with_nested), so that a
  // typed error such as PeerError can still be found. Stops all actors on return.
  virtual void run() = 0;
  // Ends run() normally. Messages still queued are dropped.
  virtual void shutdown() = 0;
  // Ends run() with an error. The first failure wins; later ones are dropped.
  virtual void fail(const std::string& what) = 0;
  // The same with an exception (what an actor's exception does): run() throws Error(what()) with
  // `error` nested in it.
  virtual void fail(std::exception_ptr error) = 0;
  // Runs `hook` once, on the failing thread, when the run is to end with an error, before the
  // actors stop: for what must let go of a wait that holds an actor's thread (an NCCL group,
  // aborted, ends the device work an updater waits for). Replaces an earlier hook.
  virtual void onFailure(std::function<void()> hook) = 0;

  virtual const SystemOptions& options() const = 0;
  // The name an address was spawned with ("?" if unknown), for error messages.
  virtual std::string nameOf(Address address) const = 0;

  // Internal: how Actor::send and tell reach a mailbox.
  virtual void deliver(Address from, Address to, std::unique_ptr<Envelope> message) = 0;
  virtual void deliverAfter(std::chrono::milliseconds delay, Address to,
                            std::unique_ptr<Envelope> message) = 0;

  static constexpr std::uint32_t kNoActor = 0xffffffffu;
};

std::unique_ptr<Runtime> makeRuntime(const SystemOptions& options);

}  // namespace troupe::actors
