// Actors: objects that own their state and talk to each other only by messages.
//
// An actor registers one handler per message type (on<M>) in its constructor. The system calls the
// handlers one message at a time, never concurrently, in the order messages arrived from each
// sender. A handler that throws ends the whole run: the system reports the actor, the message type
// and the error (see ActorSystem::run). Messages are plain C++ values moved into the receiver's
// mailbox; in-process delivery never serializes. Part of the public API: a service's own actors
// derive from Actor and run in a troupe::ActorSystem (troupe/actor_system.h).
#pragma once

#include <cstdint>
#include <functional>
#include <iosfwd>
#include <memory>
#include <string>
#include <typeindex>
#include <unordered_map>
#include <utility>

namespace troupe::actors {

// Where an actor lives: the process (node) and the actor's number within it.
struct Address {
  std::uint32_t node = 0;
  std::uint32_t actor = 0;
  bool operator==(const Address&) const = default;
};
std::ostream& operator<<(std::ostream& out, const Address& a);  // "node/actor"

// Type-erased message; M is the payload.
struct Envelope {
  virtual ~Envelope() = default;
  virtual std::type_index type() const = 0;
};

template <typename M>
struct Typed final : Envelope {
  explicit Typed(M&& m) : value(std::move(m)) {}
  std::type_index type() const override { return typeid(M); }
  M value;
};

// A readable name of a message type, for errors and traces ("troupe::actors::Batch" -> "Batch").
std::string messageName(std::type_index type);

class Runtime;  // actors/core/system.h: the runtime an actor is spawned on

class Actor {
 public:
  explicit Actor(std::string name) : name_(std::move(name)) {}
  virtual ~Actor() = default;
  Actor(const Actor&) = delete;
  Actor& operator=(const Actor&) = delete;

  const std::string& name() const { return name_; }
  Address self() const { return self_; }

  // Called once, on the actor's executor, before its first message.
  virtual void started() {}

  // Called by the system (on the actor's executor) for each message.
  void handle(Envelope& message);

 protected:
  template <typename M, typename F>
  void on(F&& handler) {
    handlers_[typeid(M)] = [h = std::forward<F>(handler)](Envelope& e) {
      h(static_cast<Typed<M>&>(e).value);
    };
  }

  template <typename M>
  void send(Address to, M message) {
    sendEnvelope(to, std::make_unique<Typed<M>>(std::move(message)));
  }

  Runtime& system() const { return *system_; }

 private:
  friend class SystemImpl;
  void sendEnvelope(Address to, std::unique_ptr<Envelope> message);
  std::string name_;
  Address self_;
  Runtime* system_ = nullptr;
  std::unordered_map<std::type_index, std::function<void(Envelope&)>> handlers_;
};

}  // namespace troupe::actors
