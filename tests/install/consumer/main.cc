// Links an installed troupe and checks that its headers and its library are the same release.
#include <troupe/config.h>
#include <troupe/error.h>
#include <troupe/version.h>

#include <cstdio>
#include <cstring>

int main() {
  if (std::strcmp(troupe::version(), TROUPE_VERSION) != 0) {
    std::fprintf(stderr, "headers %s, library %s\n", TROUPE_VERSION, troupe::version());
    return 1;
  }
  try {
    throw troupe::InputError("an error value");
  } catch (const troupe::Error& e) {
    std::printf("%s; caught: %s\n", troupe::buildSummary().c_str(), e.what());
  }
  return 0;
}
