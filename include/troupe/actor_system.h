// An actor system for a service's own actors (troupe/actor.h), the one troupe's roles run in: on
// an executor of the caller's (an Asio io_context, a thread pool) or on threads of its own.
// Actors are spawned under names and found by them; messages are plain C++ values.
//
//   struct Hello { std::string text; };
//   class Greeter : public troupe::actors::Actor {
//    public:
//     Greeter() : Actor("greeter") { on<Hello>([](Hello& h) { std::puts(h.text.c_str()); }); }
//   };
//   auto system = troupe::ActorSystem::create({.executor = [&io](auto task) {
//     asio::post(io, std::move(task)); }});
//   system->spawn("greeter", std::make_unique<Greeter>());
//   system->start();
//   system->tell("greeter", Hello{"hi"});
//
// Errors are values: a handler that throws stops the system, and stop() or wait() returns the
// error, naming the actor and the message.
#pragma once

#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <string>

#include "troupe/actor.h"
#include "troupe/status.h"

namespace troupe {

struct ActorSystemOptions {
  // Runs a task somewhere (asio::post(io, task), a pool's submit): any thread, any order. Unset:
  // `threads` threads of the system's own.
  std::function<void(std::function<void()> task)> executor;
  int threads = 2;
  // A mailbox holds this many messages; a sender outside the system waits for room up to
  // send_timeout, then its tell() is a kTimeout error naming the actor.
  std::size_t mailbox_capacity = 64;
  std::chrono::milliseconds send_timeout{30000};
};

class ActorSystem {
 public:
  static std::unique_ptr<ActorSystem> create(ActorSystemOptions options = {});
  ~ActorSystem();  // stops the system

  // Spawns `actor` under `name` (one actor a name; kInput when it is taken). Actors spawned before
  // start() begin together; later ones at once.
  Result<actors::Address> spawn(const std::string& name, std::unique_ptr<actors::Actor> actor);
  // The address of the actor spawned as `name`; kInput naming it when there is none.
  Result<actors::Address> find(const std::string& name) const;
  // The names of the actors, by name.
  std::map<std::string, actors::Address> actors() const;

  // Runs the actors: their started() and then their messages.
  Status start();
  // Sends `message` to the actor named `to` from outside any actor (waits while its mailbox is
  // full, up to send_timeout).
  template <typename M>
  Status tell(const std::string& to, M message) {
    auto address = find(to);
    if (!address) return address.status();
    return deliver(address.value(), std::make_unique<actors::Typed<M>>(std::move(message)));
  }
  // Stops the actors (messages still queued are dropped): ok, or the error that stopped them.
  Status stop();
  // Waits until an actor failed (its error) or stop() was called (ok), up to `timeout`
  // (kTimeout: still running).
  Status wait(std::chrono::milliseconds timeout);

  struct State;

 private:
  explicit ActorSystem(std::unique_ptr<State> state);
  Status deliver(actors::Address to, std::unique_ptr<actors::Envelope> message);
  std::unique_ptr<State> state_;
};

}  // namespace troupe
