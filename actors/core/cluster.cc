#include "actors/core/cluster.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <map>
#include <mutex>
#include <random>
#include <thread>

#include "actors/core/peer.h"
#include "actors/core/trace.h"
#include "actors/core/wire_codec.h"
#include "rendezvous/exchange.h"
#include "rendezvous/prefix_store.h"
#include "rendezvous/store.h"
#include "rendezvous/tcp_store.h"
#include "rendezvous/url.h"
#include "rendezvous/value.h"
#include "transport/link.h"
#include "transport/message.h"
#include "troupe/error.h"

namespace troupe::actors {

std::string checkedIncarnation(std::string text, const std::string& who) {
  const rendezvous::StoreValue value(who, "incarnation", std::move(text));
  if (value.text().size() != 16 ||
      value.text().find_first_not_of("0123456789abcdef") != std::string::npos) {
    value.refuse("a run's incarnation (16 hex digits)");
  }
  return value.text();
}

namespace {

// The run's incarnation: a random nonce rank 0 makes and publishes; every link's Hello carries it,
// so that processes of another run that shares the run id (and secret) are refused by name.
std::string incarnation(rendezvous::Store& store, const ClusterOptions& o) {
  constexpr const char* kKey = "incarnation";
  if (o.rank == 0) {
    std::random_device random;
    const std::string nonce = fmt::format("{:08x}{:08x}", random(), random());
    store.set(kKey, nonce);
    return nonce;
  }
  return checkedIncarnation(store.get(kKey, o.timeout), fmt::format("rank {}", o.rank));
}

class ClusterImpl final : public Cluster {
 public:
  ClusterImpl(const ClusterOptions& o, Runtime& system) : options_(o), system_(system) {
    if (o.serve_store && o.rank == 0) {
      const auto url = rendezvous::parseStoreUrl(o.rendezvous);
      if (url.backend->embedded) {
        server_ = rendezvous::startTcpStoreServer(url.host, url.port, o.secret);
        spdlog::info("rank 0 serves the rendezvous store at tcp://{}", server_->address());
      }
    }
    if (o.secret.empty() && o.world > 1) {
      spdlog::warn(
          "no run secret (TROUPE_SECRET or --secret-file): links and the embedded store check the "
          "run id only, so anyone who knows it can join this run");
    }
    std::shared_ptr<rendezvous::Store> raw =
        rendezvous::openStore(o.rendezvous, o.timeout, o.secret);
    store_ = rendezvous::prefixStore(std::move(raw), o.run_id);

    transport::TransportOptions t;
    t.node = static_cast<transport::NodeId>(o.rank);
    t.runId = o.run_id;
    t.secret = o.secret;
    t.interface = o.interface;
    t.unixSocket = true;
    t.connectionsPerPeer = o.connections_per_peer;
    t.incarnation = incarnation(*store_, o);
    t.connectTimeout = o.timeout;
    t.peerTimeout = o.peer_timeout;
    transport::TransportHandlers handlers;
    handlers.onMessage = [this](transport::NodeId node, transport::IncomingMessage message) {
      const auto begin = Trace::Clock::now();
      auto d = decodeMessage(node, message);
      if (options_.trace) {
        options_.trace->span("transport in", "receive " + messageName(d.message->type()), begin,
                             Trace::Clock::now());
      }
      system_.deliver(d.from, Address{static_cast<std::uint32_t>(options_.rank), d.target},
                      std::move(d.message));
    };
    handlers.onPeerLost = [this](transport::NodeId node, const std::string& why) {
      {
        std::lock_guard lock(lost_mu_);
        lost_.emplace(static_cast<int>(node), why);
      }
      if (closing_) return;
      if (isObserverNode(node)) {  // one that watched the run left: the run goes on
        spdlog::info("observer node {} left the run ({})", node, why);
        return;
      }
      if (options_.on_peer_lost && addressesKnown_ && node < addresses_.size()) {
        return options_.on_peer_lost(static_cast<int>(node), addresses_[node], why);
      }
      system_.fail(fmt::format("lost the link to node {}: {}", node, why));
    };
    transport_ = transport::makeTransport(t, std::move(handlers));

    addresses_ = rendezvous::exchange(*store_, o.rank, o.world, transport_->address(), o.timeout,
                                      "transport-addresses", o.name_of);
    addressesKnown_ = true;
    // Each pair links once: the higher rank connects to the lower one.
    for (int peer = 0; peer < o.rank; ++peer) {
      transport_->connect(static_cast<transport::NodeId>(peer), addresses_[peer]);
    }
    for (int peer = o.rank + 1; peer < o.world; ++peer) {
      transport_->waitForPeer(static_cast<transport::NodeId>(peer), o.timeout);
    }
    int most = 1;  // TCP connections to a peer (connections_per_peer, to other hosts)
    for (int peer = 0; peer < o.world; ++peer) {
      if (peer != o.rank) {
        most = std::max(most, transport_->connections(static_cast<transport::NodeId>(peer)));
      }
    }
    spdlog::info("node {} of {} linked ({}){}", o.rank, o.world, transport_->address(),
                 most > 1 ? fmt::format(", {} connections to a peer on another host", most) : "");
  }

  ~ClusterImpl() override {
    closing_ = true;
    transport_.reset();
  }

  rendezvous::Store& store() override { return *store_; }
  const std::vector<std::string>& addresses() const override { return addresses_; }

  void send(Address from, Address to, std::unique_ptr<Envelope> message) override {
    const auto begin = Trace::Clock::now();
    auto out = encodeMessage(from, to, *message);
    try {
      transport_->send(static_cast<transport::NodeId>(to.node), std::move(out));
    } catch (const transport::LinkLostError& e) {
      if (isObserverNode(to.node)) return;  // it left; the run goes on without it
      // The peer is gone: that is the run's failure (a PeerError naming it), whichever of the
      // link's loss and this send comes first; the sender's own error comes second.
      if (!closing_ && options_.on_peer_lost && addressesKnown_ && to.node < addresses_.size()) {
        options_.on_peer_lost(static_cast<int>(to.node), addresses_[to.node], e.what());
      }
      throw;
    }
    if (options_.trace) {
      options_.trace->asyncSpan("transport out", "send " + messageName(message->type()),
                                sends_.fetch_add(1), begin, Trace::Clock::now());
    }
  }

  kernels::Tensor sharedBuffer(Address to, kernels::Shape shape) override {
    return transport_->sharedBuffer(static_cast<transport::NodeId>(to.node), std::move(shape));
  }

  void barrier(const std::string& name) override {
    rendezvous::barrier(*store_, name, options_.rank, options_.world, options_.timeout);
  }

  void finish() override {
    // A process whose link dropped before it reached the end (it failed, or was killed) never
    // comes: the wait ends at once, naming it, rather than after the timeout.
    rendezvous::barrier(*store_, "end", options_.rank, options_.world, options_.timeout,
                        [this](int node) -> std::string {
                          std::lock_guard lock(lost_mu_);
                          const auto it = lost_.find(node);
                          if (it == lost_.end()) return "";
                          return fmt::format("{} left the run (lost the link: {})",
                                             options_.name_of ? options_.name_of(node)
                                                              : fmt::format("node {}", node),
                                             it->second);
                        });
    if (options_.rank != 0) {
      store_->add("left", 1);
      return;
    }
    const auto deadline = std::chrono::steady_clock::now() + options_.timeout;
    while (store_->add("left", 0) < options_.world - 1) {
      if (std::chrono::steady_clock::now() > deadline) {
        throw TimeoutError(fmt::format("rank 0 waited {} ms for the others to leave the store",
                                       options_.timeout.count()));
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
  }

 private:
  ClusterOptions options_;
  Runtime& system_;
  std::unique_ptr<rendezvous::TcpStoreServer> server_;
  std::shared_ptr<rendezvous::Store> store_;
  std::vector<std::string> addresses_;  // read-only once addressesKnown_
  std::atomic<bool> addressesKnown_{false};
  std::unique_ptr<transport::Transport> transport_;
  std::atomic<bool> closing_{false};
  std::atomic<std::uint64_t> sends_{0};
  std::mutex lost_mu_;
  std::map<int, std::string> lost_;  // the nodes whose links dropped, and why
};

}  // namespace

std::unique_ptr<Cluster> joinCluster(const ClusterOptions& options, Runtime& system) {
  return std::make_unique<ClusterImpl>(options, system);
}

}  // namespace troupe::actors
