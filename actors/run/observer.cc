// troupe::Observer (include/troupe/observer.h): an actor system of its own on an observer node
// id, one link (to the chief), and an actor that receives the chief's Weights.
#include "troupe/observer.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <atomic>
#include <condition_variable>
#include <limits>
#include <mutex>
#include <sstream>
#include <thread>

#include "actors/config/train_config.h"
#include "actors/core/messages.h"
#include "actors/core/status_of.h"
#include "actors/core/system.h"
#include "actors/core/wire_codec.h"
#include "actors/roles/observers.h"
#include "actors/run/run_plan.h"
#include "rendezvous/prefix_store.h"
#include "rendezvous/store.h"
#include "rendezvous/url.h"
#include "rendezvous/value.h"
#include "transport/link.h"
#include "troupe/error.h"

namespace troupe {
namespace {

using actors::Actor;
using actors::Address;

// Where the observation stands, shared by the caller and the observer's actor.
struct Watch {
  std::mutex mu;
  std::condition_variable changed;
  std::int64_t newest = -1;
  bool last_came = false;
  std::string lost;  // why the chief's link is gone; empty: it is not
};

// What the chief published under kObserveKey.
struct ChiefRecord {
  std::uint32_t actor = 0;
  std::int64_t steps_per_epoch = 0, first_step = 0, last_step = 0, num_params = 0;
  std::string address;
};

ChiefRecord parseRecord(std::string text) {
  const rendezvous::StoreValue value("observer", actors::kObserveKey, std::move(text));
  const auto words = value.words(6);
  constexpr std::int64_t kMax = std::numeric_limits<std::int64_t>::max();
  ChiefRecord r;
  r.actor = static_cast<std::uint32_t>(
      value.integer(words[0], 0, std::numeric_limits<std::uint32_t>::max(), "the chief's actor"));
  r.steps_per_epoch = value.integer(words[1], 1, kMax, "steps per epoch");
  r.first_step = value.integer(words[2], 0, kMax, "the first step");
  r.last_step = value.integer(words[3], r.first_step, kMax, "the last step");
  r.num_params = value.integer(words[4], 1, kMax, "the model's parameters");
  r.address = std::string(words[5]);
  return r;
}

class Receiver final : public Actor {
 public:
  Receiver(Address chief, std::uint32_t node, std::int64_t every, const ChiefRecord& record,
           std::function<void(const ObservedWeights&)> on_weights, std::shared_ptr<Watch> watch)
      : Actor("observer"),
        chief_(chief),
        node_(node),
        every_(every),
        record_(record),
        on_weights_(std::move(on_weights)),
        watch_(std::move(watch)) {
    on<actors::Weights>([this](actors::Weights& w) { received(w); });
  }

  void started() override { send(chief_, actors::Subscribe{node_, self().actor, every_}); }

 private:
  void received(const actors::Weights& w) {
    if (w.weights.numel() != record_.num_params || w.weights.dtype() != kernels::DType::kFloat32) {
      throw InputError(fmt::format("the chief sent {} weights of step {}, the run's model has {}",
                                   w.weights.numel(), w.step, record_.num_params));
    }
    ObservedWeights o;
    o.step = w.step;
    o.steps_per_epoch = record_.steps_per_epoch;
    o.last_step = record_.last_step;
    o.weights = {w.weights.f32(), static_cast<std::size_t>(w.weights.numel())};
    if (on_weights_) on_weights_(o);
    std::lock_guard lock(watch_->mu);
    watch_->newest = w.step;
    watch_->last_came = w.step >= record_.last_step;
    watch_->changed.notify_all();
  }

  Address chief_;
  std::uint32_t node_;
  std::int64_t every_;
  ChiefRecord record_;
  std::function<void(const ObservedWeights&)> on_weights_;
  std::shared_ptr<Watch> watch_;
};

class ObserverImpl final : public Observer {
 public:
  ObserverImpl(const actors::TrainOptions& o, std::int64_t every,
               std::function<void(const ObservedWeights&)> on_weights) {
    const auto timeout = actors::fromSeconds(o.rendezvous_timeout_s);
    std::shared_ptr<rendezvous::Store> raw = rendezvous::openStore(o.rendezvous, timeout, o.secret);
    std::unique_ptr<rendezvous::Store> store = rendezvous::prefixStore(raw, o.run_id);
    const ChiefRecord record = parseRecord(store->get(actors::kObserveKey, timeout));
    const std::string incarnation =
        actors::checkedIncarnation(store->get("incarnation", timeout), "observer");
    node_ = actors::kObserverNodeBase +
            static_cast<std::uint32_t>(store->add(actors::kObserversKey, 1) - 1);

    actors::SystemOptions so;
    so.node = node_;
    so.pool_threads = 1;
    so.remote = [this](Address from, Address to, std::unique_ptr<actors::Envelope> message) {
      transport_->send(static_cast<transport::NodeId>(to.node),
                       actors::encodeMessage(from, to, *message));
    };
    system_ = actors::makeRuntime(so);
    system_->spawn(std::make_unique<Receiver>(Address{0, record.actor}, node_, every, record,
                                              std::move(on_weights), watch_),
                   actors::SpawnOptions{.thread = "observer"});

    transport::TransportOptions t;
    t.node = node_;
    t.runId = o.run_id;
    t.secret = o.secret;
    t.interface = o.interface;
    t.unixSocket = true;
    t.incarnation = incarnation;
    t.connectTimeout = timeout;
    t.peerTimeout = actors::fromSeconds(o.peer_timeout_s);
    transport::TransportHandlers handlers;
    handlers.onMessage = [this](transport::NodeId from, transport::IncomingMessage message) {
      auto d = actors::decodeMessage(from, message);
      system_->deliver(d.from, Address{node_, d.target}, std::move(d.message));
    };
    handlers.onPeerLost = [this](transport::NodeId, const std::string& why) {
      {
        std::lock_guard lock(watch_->mu);
        watch_->lost = why;
        watch_->changed.notify_all();
      }
      system_->shutdown();
    };
    transport_ = transport::makeTransport(t, std::move(handlers));
    transport_->connect(0, record.address);
    spdlog::info("observer node {} joined run {}: the weights every {} steps", node_, o.run_id,
                 every);
    thread_ = std::thread([this] {
      try {
        system_->run();
      } catch (const std::exception& e) {
        std::lock_guard lock(watch_->mu);
        if (watch_->lost.empty()) watch_->lost = e.what();
        watch_->changed.notify_all();
      }
    });
  }

  ~ObserverImpl() override {
    system_->shutdown();
    if (thread_.joinable()) thread_.join();
    transport_.reset();  // closes the link: the chief drops this observer
  }

  Status wait(std::chrono::milliseconds timeout) override {
    std::unique_lock lock(watch_->mu);
    const bool ended = watch_->changed.wait_for(
        lock, timeout, [&] { return watch_->last_came || !watch_->lost.empty(); });
    if (watch_->last_came) return {};
    if (ended) {
      return {ErrorKind::kPeer,
              fmt::format("observer node {}: lost the chief (worker 0) before the run's last "
                          "step, after the weights of step {}: {}",
                          node_, watch_->newest, watch_->lost)};
    }
    return {ErrorKind::kTimeout,
            fmt::format("observer node {}: the run still goes after {} ms (newest weights: step "
                        "{})",
                        node_, timeout.count(), watch_->newest)};
  }

  std::int64_t newestStep() const override {
    std::lock_guard lock(watch_->mu);
    return watch_->newest;
  }

 private:
  std::uint32_t node_ = 0;
  std::shared_ptr<Watch> watch_ = std::make_shared<Watch>();
  std::unique_ptr<actors::Runtime> system_;
  std::unique_ptr<transport::Transport> transport_;
  std::thread thread_;
};

}  // namespace

Result<std::unique_ptr<Observer>> Observer::join(
    const ObserverSettings& settings, std::int64_t every_steps,
    std::function<void(const ObservedWeights&)> on_weights) {
  if (every_steps < 1) {
    return Status{
        ErrorKind::kInput,
        fmt::format("Observer::join: every {} steps: a number of steps >= 1", every_steps)};
  }
  try {
    const auto o = actors::loadTrainOptions("", settings);
    if (o.rendezvous.empty()) {
      return Status{ErrorKind::kInput,
                    "Observer::join: no rendezvous (settings' rendezvous, or TROUPE_RENDEZVOUS): "
                    "the run's store is how an observer finds its chief"};
    }
    return std::unique_ptr<Observer>(new ObserverImpl(o, every_steps, std::move(on_weights)));
  } catch (const std::exception& e) {
    return actors::statusOf(e);
  }
}

}  // namespace troupe
