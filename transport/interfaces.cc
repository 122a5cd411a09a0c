#include "transport/interfaces.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <netinet/in.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "transport/link.h"
#include "troupe/error.h"

namespace troupe::transport {

std::vector<InterfaceAddress> listInterfaces() {
  ifaddrs* list = nullptr;
  if (getifaddrs(&list) != 0) {
    throw IoError(std::string("getifaddrs failed: ") + std::strerror(errno));
  }
  std::vector<InterfaceAddress> out;
  for (ifaddrs* it = list; it; it = it->ifa_next) {
    if (!it->ifa_name) continue;
    auto known = std::find_if(out.begin(), out.end(),
                              [&](const InterfaceAddress& a) { return a.name == it->ifa_name; });
    if (known == out.end()) known = out.insert(out.end(), {it->ifa_name, ""});
    if (known->ipv4.empty() && it->ifa_addr && it->ifa_addr->sa_family == AF_INET) {
      char text[INET_ADDRSTRLEN] = {};
      const auto* in = reinterpret_cast<const sockaddr_in*>(it->ifa_addr);
      if (inet_ntop(AF_INET, &in->sin_addr, text, sizeof text)) known->ipv4 = text;
    }
  }
  freeifaddrs(list);
  return out;
}

std::string resolveInterface(const std::string& name) {
  const auto interfaces = listInterfaces();
  std::string known;
  for (const auto& i : interfaces) {
    if (i.name == name && !i.ipv4.empty()) return i.ipv4;
    known += (known.empty() ? "" : ", ") + i.name + (i.ipv4.empty() ? " (no IPv4)" : "");
  }
  throw InputError("unknown network interface '" + name +
                   "' (or it has no IPv4 address); this host has: " + known);
}

}  // namespace troupe::transport
