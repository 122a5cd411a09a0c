// troupe::ActorSystem (include/troupe/actor_system.h): the internal actor system
// (actors/core/system.h) run on a thread of its own, its actors named, its errors turned into
// Status values.
#include <fmt/format.h>

#include <condition_variable>
#include <mutex>
#include <thread>

#include "actors/core/status_of.h"
#include "actors/core/system.h"
#include "troupe/actor_system.h"
#include "troupe/error.h"

namespace troupe {

struct ActorSystem::State {
  std::unique_ptr<actors::Runtime> system;
  std::thread runner;
  mutable std::mutex mu;
  std::condition_variable changed;
  std::map<std::string, actors::Address> names;
  bool started = false, ended = false;
  Status status;
};

ActorSystem::ActorSystem(std::unique_ptr<State> state) : state_(std::move(state)) {}

ActorSystem::~ActorSystem() {
  stop();
}

std::unique_ptr<ActorSystem> ActorSystem::create(ActorSystemOptions options) {
  actors::SystemOptions so;
  so.executor = std::move(options.executor);
  so.pool_threads = so.executor ? 1 : std::max(1, options.threads);  // with an executor: timers
  so.mailbox_capacity = std::max<std::size_t>(1, options.mailbox_capacity);
  so.external_send_timeout = options.send_timeout;
  auto state = std::make_unique<State>();
  state->system = actors::makeRuntime(so);
  return std::unique_ptr<ActorSystem>(new ActorSystem(std::move(state)));
}

Result<actors::Address> ActorSystem::spawn(const std::string& name,
                                           std::unique_ptr<actors::Actor> actor) {
  std::lock_guard lock(state_->mu);
  if (state_->ended)
    return Status{ErrorKind::kInput, "spawn of '" + name + "': the system stopped"};
  if (!actor) return Status{ErrorKind::kInput, "spawn of '" + name + "': no actor"};
  if (state_->names.count(name)) {
    return Status{ErrorKind::kInput, "spawn of '" + name + "': an actor has that name already"};
  }
  try {
    const auto address = state_->system->spawn(std::move(actor));
    state_->names.emplace(name, address);
    return address;
  } catch (const std::exception& e) {
    return actors::statusOf(e);
  }
}

Result<actors::Address> ActorSystem::find(const std::string& name) const {
  std::lock_guard lock(state_->mu);
  const auto it = state_->names.find(name);
  if (it == state_->names.end()) {
    return Status{ErrorKind::kInput, fmt::format("no actor named '{}' ({} actor(s) spawned)", name,
                                                 state_->names.size())};
  }
  return it->second;
}

std::map<std::string, actors::Address> ActorSystem::actors() const {
  std::lock_guard lock(state_->mu);
  return state_->names;
}

Status ActorSystem::start() {
  std::lock_guard lock(state_->mu);
  if (state_->started) return {ErrorKind::kInput, "start: the system started already"};
  state_->started = true;
  State* state = state_.get();
  state_->runner = std::thread([state] {
    Status status;
    try {
      state->system->run();
    } catch (const std::exception& e) {
      status = actors::statusOf(e);
    }
    std::lock_guard lock(state->mu);
    state->ended = true;
    state->status = std::move(status);
    state->changed.notify_all();
  });
  return {};
}

Status ActorSystem::deliver(actors::Address to, std::unique_ptr<actors::Envelope> message) {
  try {
    state_->system->deliver(actors::Address{0, actors::Runtime::kNoActor}, to, std::move(message));
  } catch (const std::exception& e) {
    return actors::statusOf(e);
  }
  return {};
}

Status ActorSystem::stop() {
  state_->system->shutdown();
  if (state_->runner.joinable()) state_->runner.join();
  std::lock_guard lock(state_->mu);
  state_->ended = true;
  return state_->status;
}

Status ActorSystem::wait(std::chrono::milliseconds timeout) {
  std::unique_lock lock(state_->mu);
  if (!state_->started) return {ErrorKind::kInput, "wait: the system was never started"};
  if (!state_->changed.wait_for(lock, timeout, [&] { return state_->ended; })) {
    return {ErrorKind::kTimeout,
            fmt::format("the actor system still runs after {} ms", timeout.count())};
  }
  return state_->status;
}

}  // namespace troupe
