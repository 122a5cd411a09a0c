// Links an installed troupe and checks that its headers and its library are the same release.
#include <troupe/config.h>
#include <troupe/error.h>
#include <troupe/trainer.h>
#include <troupe/version.h>

#include <cstdio>
#include <cstring>
#include <string>

int main() {
  if (std::strcmp(troupe::version(), TROUPE_VERSION) != 0) {
    std::fprintf(stderr, "headers %s, library %s\n", TROUPE_VERSION, troupe::version());
    return 1;
  }
  // The trainer answers a misspelt setting with an error value, before anything runs.
  auto started = troupe::Trainer::start("", {{"bach_size", "32"}});
  if (started || started.status().kind() != troupe::ErrorKind::kInput ||
      started.status().message().find("did you mean --batch_size?") == std::string::npos) {
    std::fprintf(stderr, "Trainer::start gave: %s\n", started.status().message().c_str());
    return 1;
  }
  std::printf("%s; Trainer::start: %s\n", troupe::buildSummary().c_str(),
              started.status().message().substr(0, 60).c_str());
  return 0;
}
