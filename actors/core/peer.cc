#include "actors/core/peer.h"

#include <fmt/format.h>

namespace troupe::actors {

std::string Peer::str() const {
  return address.empty() ? fmt::format("{} {}", role, rank)
                         : fmt::format("{} {} at {}", role, rank, address);
}

std::string PeerError::culpritLine() const {
  return fmt::format("troupe-culprit: {} {}: {}", peer_.role, peer_.rank, reason_);
}

bool visitNested(const std::exception& error,
                 const std::function<bool(const std::exception&)>& visit) {
  if (visit(error)) return true;
  const auto* nested = dynamic_cast<const std::nested_exception*>(&error);
  if (!nested || !nested->nested_ptr()) return false;
  try {
    nested->rethrow_nested();
  } catch (const std::exception& inner) {
    return visitNested(inner, visit);
  } catch (...) {
  }
  return false;
}

std::optional<PeerError> findPeerError(const std::exception& error) {
  std::optional<PeerError> found;
  visitNested(error, [&](const std::exception& e) {
    if (const auto* peer = dynamic_cast<const PeerError*>(&e)) found = *peer;
    return found.has_value();
  });
  return found;
}

namespace {

// "tcp://HOST:PORT;unix://...": the TCP part names the host.
std::string tcpAddress(const std::string& transport_address) {
  std::string tcp = transport_address.substr(0, transport_address.find(';'));
  if (tcp.rfind("tcp://", 0) == 0) tcp = tcp.substr(6);
  return tcp;
}

}  // namespace

Peer RunMembers::roleOf(std::uint32_t node) const {
  const auto n = static_cast<std::int64_t>(node);
  if (n < workers_) return {"worker", static_cast<int>(n), ""};
  if (n < workers_ + servers_) return {"server", static_cast<int>(n - workers_), ""};
  return {"node", static_cast<int>(n), ""};
}

Peer RunMembers::ofNode(std::uint32_t node) const {
  Peer peer = roleOf(node);
  if (node < addresses_.size()) peer.address = addresses_[node];
  return peer;
}

Peer RunMembers::ofNode(std::uint32_t node, const std::string& transport_address) const {
  Peer peer = roleOf(node);
  peer.address = tcpAddress(transport_address);
  return peer;
}

void RunMembers::setAddresses(const std::vector<std::string>& transport_addresses) {
  addresses_.clear();
  for (const auto& a : transport_addresses)
    addresses_.push_back(tcpAddress(a));
}

PeerError lostLinkError(const Peer& peer, const std::string& why) {
  return PeerError(peer, fmt::format("lost the link ({})", why),
                   fmt::format("lost the link to {}: {}", peer.str(), why));
}

Peer peerOf(const RunMembersPtr& members, const std::string& role, int rank) {
  if (!members) return {role, rank, ""};
  return role == "server" ? members->server(rank) : members->worker(rank);
}

}  // namespace troupe::actors
