// messageName (troupe/actor.h), apart from the actor system: the wire codec names messages too.
#include <cxxabi.h>

#include <cstdlib>
#include <string>

#include "troupe/actor.h"

namespace troupe::actors {

std::string messageName(std::type_index type) {
  int status = 0;
  char* demangled = abi::__cxa_demangle(type.name(), nullptr, nullptr, &status);
  std::string name = status == 0 && demangled ? demangled : type.name();
  std::free(demangled);
  const auto colon = name.rfind("::");
  return colon == std::string::npos ? name : name.substr(colon + 2);
}

}  // namespace troupe::actors
