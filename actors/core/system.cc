#include "actors/core/system.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <asio/io_context.hpp>
#include <asio/post.hpp>
#include <asio/steady_timer.hpp>
#include <asio/strand.hpp>
#include <condition_variable>
#include <deque>
#include <map>
#include <mutex>
#include <optional>
#include <ostream>
#include <thread>
#include <vector>

#include "troupe/error.h"

namespace troupe::actors {

std::ostream& operator<<(std::ostream& out, const Address& a) {
  return out << a.node << "/" << a.actor;
}

void Actor::handle(Envelope& message) {
  auto it = handlers_.find(message.type());
  if (it == handlers_.end()) {
    throw InvariantError("actor '" + name_ + "' has no handler for message " +
                         messageName(message.type()));
  }
  it->second(message);
}

namespace {

using Clock = std::chrono::steady_clock;

struct Cell {
  std::unique_ptr<Actor> actor;
  std::size_t capacity = 0;
  // Executes drain(): a strand of the shared pool, or a named thread's io_context.
  asio::io_context* thread_context = nullptr;
  std::optional<asio::strand<asio::io_context::executor_type>> strand;
  bool inline_handlers = false;  // SpawnOptions::inline_handlers (on the pool's strand otherwise)

  std::mutex mu;
  std::condition_variable room;  // for external senders
  std::deque<std::unique_ptr<Envelope>> mailbox;
  bool scheduled = false;
  std::vector<Cell*> waiters;  // actors whose outbox waits for room here

  // Touched only by this actor's own drain (one at a time).
  struct Pending {
    Cell* target = nullptr;  // null: remote_to, through SystemOptions::remote
    Address remote_to;
    std::unique_ptr<Envelope> message;
  };
  std::deque<Pending> outbox;
};

// The actor whose drain() runs on this thread now (null: none). A send from outside any actor
// made there (a callback the actor's own work runs: a leased chunk released as the transport
// copies it) is that actor's own when it goes to that actor, and is not bounded either.
thread_local const Cell* draining_cell = nullptr;

}  // namespace

class SystemImpl final : public Runtime {
 public:
  explicit SystemImpl(const SystemOptions& options)
      : options_(options), work_(asio::make_work_guard(pool_)) {
    for (int i = 0; i < std::max(1, options_.pool_threads); ++i) {
      pool_threads_.emplace_back([this] { runContext(pool_); });
    }
  }

  ~SystemImpl() override { stopAll(); }

  Address spawn(std::unique_ptr<Actor> actor, SpawnOptions spawn_options) override {
    auto cell = std::make_unique<Cell>();
    cell->capacity =
        spawn_options.mailbox_capacity ? spawn_options.mailbox_capacity : options_.mailbox_capacity;
    Address address;
    {
      std::lock_guard lock(cells_mu_);
      TROUPE_ENFORCE(!stopping_, "spawn after the system stopped");
      address = Address{options_.node, static_cast<std::uint32_t>(cells_.size())};
      actor->self_ = address;
      actor->system_ = this;
      cell->actor = std::move(actor);
      cell->inline_handlers = spawn_options.inline_handlers;
      if (!spawn_options.thread.empty() && !spawn_options.inline_handlers) {
        auto& t = threads_[spawn_options.thread];
        if (!t.context) {
          t.context = std::make_unique<asio::io_context>(1);
          auto* ctx = t.context.get();
          t.thread = std::thread([this, ctx] {
            auto guard = asio::make_work_guard(*ctx);
            runContext(*ctx);
          });
        }
        cell->thread_context = t.context.get();
      } else {
        cell->strand.emplace(asio::make_strand(pool_));
      }
      // Held until started() ran: messages sent before then wait in the mailbox.
      cell->scheduled = true;
      cells_.push_back(std::move(cell));
      if (running_) start(cells_.back().get());
    }
    return address;
  }

  void run() override {
    {
      std::lock_guard lock(cells_mu_);
      running_ = true;
      for (auto& c : cells_)
        start(c.get());
    }
    std::unique_lock lock(state_mu_);
    state_cv_.wait(lock, [this] { return done_; });
    auto error = error_;
    auto cause = cause_;
    lock.unlock();
    stopAll();
    if (!error) return;
    if (cause) {
      try {
        std::rethrow_exception(cause);
      } catch (...) {
        std::throw_with_nested(Error(*error));
      }
    }
    throw Error(*error);
  }

  void shutdown() override { finish(std::nullopt); }
  void onFailure(std::function<void()> hook) override {
    std::lock_guard lock(state_mu_);
    on_failure_ = std::move(hook);
  }
  void fail(const std::string& what) override { finish(what); }
  void fail(std::exception_ptr error) override {
    try {
      std::rethrow_exception(error);
    } catch (const std::exception& e) {
      finish(std::string(e.what()), error);
    } catch (...) {
      finish(std::string("unknown exception"), error);
    }
  }

  const SystemOptions& options() const override { return options_; }

  std::string nameOf(Address address) const override {
    if (address.actor == kNoActor) return "main";
    std::lock_guard lock(cells_mu_);
    if (address.node != options_.node || address.actor >= cells_.size()) return "?";
    return cells_[address.actor]->actor->name();
  }

  void deliver(Address from, Address to, std::unique_ptr<Envelope> message) override {
    if (to.node != options_.node) {
      if (!options_.remote) {
        throw Error("no route to node " + std::to_string(to.node) + " for " +
                    messageName(message->type()) + ": this process has no transport");
      }
      if (from.node == options_.node && from.actor != kNoActor) {
        Cell* sender = cellOf(from);
        // Remote sends keep the sender's order too: behind what waits in its outbox.
        if (sender && !sender->outbox.empty()) {
          sender->outbox.push_back({nullptr, to, std::move(message)});
          return;
        }
      }
      options_.remote(from, to, std::move(message));
      return;
    }
    Cell* target = cellOf(to);
    TROUPE_ENFORCE(target != nullptr, "send to unknown actor ", to.actor, " on node ", to.node);
    if (from.actor == kNoActor && target == draining_cell) {  // a note to itself, as below
      enqueueUnbounded(target, std::move(message));
      return;
    }
    if (from.actor == kNoActor || from.node != options_.node) {
      deliverExternal(target, std::move(message));
      return;
    }
    Cell* sender = cellOf(from);
    // A note to itself: the bound is not for it, since an actor that waited for room in its own
    // mailbox would wait for itself.
    if (sender == target) {
      enqueueUnbounded(target, std::move(message));
      return;
    }
    // Keep per-sender order: once something waits in the outbox, everything queues behind it.
    if (!sender->outbox.empty() || !tryEnqueue(target, message, sender)) {
      sender->outbox.push_back({target, {}, std::move(message)});
    }
  }

  void deliverAfter(std::chrono::milliseconds delay, Address to,
                    std::unique_ptr<Envelope> message) override {
    auto timer = std::make_shared<asio::steady_timer>(pool_, delay);
    std::shared_ptr<Envelope> shared(std::move(message));
    timer->async_wait([this, timer, to, shared](const std::error_code& ec) mutable {
      if (ec) return;
      Cell* target = cellOf(to);
      if (!target) return;
      // Timers bypass the capacity bound: they are few and must not block a pool thread.
      std::unique_ptr<Envelope> owned(new Forward(shared));
      enqueueUnbounded(target, std::move(owned));
    });
  }

 private:
  // Wraps a shared envelope so a timer callback (copyable) can hand it over.
  struct Forward final : Envelope {
    explicit Forward(std::shared_ptr<Envelope> e) : inner(std::move(e)) {}
    std::type_index type() const override { return inner->type(); }
    std::shared_ptr<Envelope> inner;
  };

  static Envelope& unwrap(Envelope& e) {
    if (auto* f = dynamic_cast<Forward*>(&e)) return *f->inner;
    return e;
  }

  void runContext(asio::io_context& ctx) {
    try {
      ctx.run();
    } catch (const std::exception& e) {
      fail(std::string("actor system thread: ") + e.what());
    }
  }

  void start(Cell* c) {
    post(c, [this, c] {
      if (!runHandler(
              c, [c] { c->actor->started(); }, "start"))
        return;
      drain(c);
    });
  }

  template <typename F>
  void post(Cell* c, F&& f) {
    if (c->thread_context) {
      asio::post(*c->thread_context, std::forward<F>(f));
    } else if (options_.executor) {
      // One drain at a time per actor (Cell::scheduled) keeps its handlers serial here too.
      options_.executor(std::function<void()>(std::forward<F>(f)));
    } else {
      asio::post(*c->strand, std::forward<F>(f));
    }
  }

  Cell* cellOf(Address a) const {
    std::lock_guard lock(cells_mu_);
    if (a.node != options_.node || a.actor >= cells_.size()) return nullptr;
    return cells_[a.actor].get();
  }

  // Enqueues if there is room; otherwise registers `waiter` to be woken when room appears.
  bool tryEnqueue(Cell* target, std::unique_ptr<Envelope>& message, Cell* waiter) {
    {
      std::lock_guard lock(target->mu);
      if (target->mailbox.size() >= target->capacity) {
        if (std::find(target->waiters.begin(), target->waiters.end(), waiter) ==
            target->waiters.end()) {
          target->waiters.push_back(waiter);
        }
        return false;
      }
      target->mailbox.push_back(std::move(message));
    }
    schedule(target);
    return true;
  }

  void enqueueUnbounded(Cell* target, std::unique_ptr<Envelope> message) {
    {
      std::lock_guard lock(target->mu);
      target->mailbox.push_back(std::move(message));
    }
    schedule(target);
  }

  void deliverExternal(Cell* target, std::unique_ptr<Envelope> message) {
    {
      std::unique_lock lock(target->mu);
      const bool has_room = target->room.wait_for(lock, options_.external_send_timeout, [&] {
        return target->mailbox.size() < target->capacity || isDone();
      });
      if (isDone()) return;
      if (!has_room) {
        const std::string what = "sending " + messageName(message->type()) + " to actor '" +
                                 target->actor->name() + "' timed out after " +
                                 std::to_string(options_.external_send_timeout.count()) +
                                 " ms: its mailbox stayed full";
        lock.unlock();
        fail(what);
        throw TimeoutError(what);
      }
      target->mailbox.push_back(std::move(message));
    }
    schedule(target);
  }

  void schedule(Cell* c) {
    {
      std::lock_guard lock(c->mu);
      if (c->scheduled || (c->mailbox.empty() && c->outbox.empty())) return;
      c->scheduled = true;
    }
    // Inline on this thread, unless it is in an inline drain already (no nesting, no recursion).
    thread_local bool draining_inline = false;
    if (c->inline_handlers && !draining_inline) {
      struct Draining {
        Draining() { draining_inline = true; }
        ~Draining() { draining_inline = false; }
      } draining;
      drain(c);
      return;
    }
    post(c, [this, c] { drain(c); });
  }

  // Flushes the outbox as far as receivers have room; true if it is empty afterwards.
  bool flushOutbox(Cell* c) {
    while (!c->outbox.empty()) {
      auto& pending = c->outbox.front();
      if (!pending.target) {
        options_.remote(c->actor->self(), pending.remote_to, std::move(pending.message));
      } else if (!tryEnqueue(pending.target, pending.message, c)) {
        return false;
      }
      c->outbox.pop_front();
    }
    return true;
  }

  template <typename F>
  bool runHandler(Cell* c, F&& f, const std::string& what) {
    if (isDone()) return false;
    try {
      f();
      return true;
    } catch (const std::exception& e) {
      finish("actor '" + c->actor->name() + "' failed handling " + what + ": " + e.what(),
             std::current_exception());
    } catch (...) {
      fail("actor '" + c->actor->name() + "' failed handling " + what + ": unknown exception");
    }
    return false;
  }

  void drain(Cell* c) {
    constexpr int kBurst = 32;  // messages per turn, so a busy actor leaves the pool to others
    struct Draining {  // draining_cell for this drain (an inline one runs within another's)
      explicit Draining(const Cell* c) : outer(draining_cell) { draining_cell = c; }
      ~Draining() { draining_cell = outer; }
      const Cell* outer;
    } draining(c);
    for (int n = 0; n < kBurst; ++n) {
      if (isDone()) return;
      if (!flushOutbox(c)) {
        // Parked: woken by the receiver once it has room (see tryEnqueue / wakeWaiters).
        std::lock_guard lock(c->mu);
        c->scheduled = false;
        return;
      }
      std::unique_ptr<Envelope> message;
      std::vector<Cell*> waiters;
      {
        std::lock_guard lock(c->mu);
        if (c->mailbox.empty()) {
          c->scheduled = false;
          return;
        }
        message = std::move(c->mailbox.front());
        c->mailbox.pop_front();
        waiters.swap(c->waiters);
      }
      c->room.notify_all();
      for (Cell* w : waiters)
        schedule(w);
      Envelope& payload = unwrap(*message);
      if (!runHandler(
              c, [&] { c->actor->handle(payload); }, messageName(payload.type()))) {
        return;
      }
    }
    {
      std::lock_guard lock(c->mu);
      c->scheduled = false;
    }
    schedule(c);
  }

  bool isDone() {
    std::lock_guard lock(state_mu_);
    return done_;
  }

  void finish(std::optional<std::string> error, std::exception_ptr cause = nullptr) {
    std::function<void()> hook;
    {
      std::lock_guard lock(state_mu_);
      if (done_) return;
      done_ = true;
      if (error) hook = std::move(on_failure_);
      error_ = std::move(error);
      cause_ = std::move(cause);
    }
    if (hook) hook();
    state_cv_.notify_all();
    std::lock_guard lock(cells_mu_);
    for (auto& c : cells_)
      c->room.notify_all();
  }

  void stopAll() {
    std::vector<std::thread> threads;
    {
      std::lock_guard lock(cells_mu_);
      if (stopping_) return;
      stopping_ = true;
    }
    finish(std::nullopt);
    work_.reset();
    pool_.stop();
    for (auto& t : pool_threads_) {
      if (t.joinable() && t.get_id() != std::this_thread::get_id()) t.join();
    }
    for (auto& [name, t] : threads_) {
      t.context->stop();
      if (t.thread.joinable()) {
        if (t.thread.get_id() == std::this_thread::get_id()) {
          t.thread.detach();
        } else {
          t.thread.join();
        }
      }
    }
    // Pool threads that could not be joined (stopAll from a pool thread) are detached.
    for (auto& t : pool_threads_) {
      if (t.joinable()) t.detach();
    }
  }

  SystemOptions options_;
  asio::io_context pool_;
  asio::executor_work_guard<asio::io_context::executor_type> work_;
  std::vector<std::thread> pool_threads_;

  struct NamedThread {
    std::unique_ptr<asio::io_context> context;
    std::thread thread;
  };
  mutable std::mutex cells_mu_;
  std::vector<std::unique_ptr<Cell>> cells_;
  std::map<std::string, NamedThread> threads_;
  bool stopping_ = false;
  bool running_ = false;  // run() was called: actors spawned from now on start at once

  std::mutex state_mu_;
  std::condition_variable state_cv_;
  bool done_ = false;
  std::optional<std::string> error_;
  std::exception_ptr cause_;  // the exception behind error_, if one
  std::function<void()> on_failure_;
};

kernels::Tensor Runtime::sharedBuffer(Address to, kernels::Shape shape) const {
  const auto& o = options();
  if (to.node != o.node && o.remote_buffer) return o.remote_buffer(to, std::move(shape));
  return {};
}

void Actor::sendEnvelope(Address to, std::unique_ptr<Envelope> message) {
  TROUPE_ENFORCE(system_ != nullptr, "actor '", name_, "' sent a message before it was spawned");
  system_->deliver(self_, to, std::move(message));
}

std::unique_ptr<Runtime> makeRuntime(const SystemOptions& options) {
  return std::make_unique<SystemImpl>(options);
}

}  // namespace troupe::actors
