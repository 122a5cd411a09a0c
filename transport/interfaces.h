// Inside the transport: this host's network interfaces.
#pragma once

#include <string>
#include <vector>

namespace troupe::transport {

struct InterfaceAddress {
  std::string name;
  std::string ipv4;  // empty if the interface has no IPv4 address
};

// Every interface (getifaddrs), each once, with its first IPv4 address. Throws IoError.
std::vector<InterfaceAddress> listInterfaces();

}  // namespace troupe::transport
