// Links an installed troupe and checks that its headers and its library are the same release.
#include <troupe/actor_system.h>
#include <troupe/config.h>
#include <troupe/error.h>
#include <troupe/trainer.h>
#include <troupe/version.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <future>
#include <memory>
#include <string>

int main() {
  if (std::strcmp(troupe::version(), TROUPE_VERSION) != 0) {
    std::fprintf(stderr, "headers %s, library %s\n", TROUPE_VERSION, troupe::version());
    return 1;
  }
  // The trainer answers a misspelt setting with an error value, before anything runs.
  auto started = troupe::Trainer::start("", {{"bach_size", "32"}});
  if (started || started.status().kind() != troupe::ErrorKind::kInput ||
      started.status().message().find("did you mean 'batch_size'?") == std::string::npos) {
    std::fprintf(stderr, "Trainer::start gave: %s\n", started.status().message().c_str());
    return 1;
  }
  std::printf("%s; Trainer::start: %s\n", troupe::buildSummary().c_str(),
              started.status().message().substr(0, 60).c_str());
  // An actor of the program's own, found by name, in the installed actor system.
  struct Count {
    int n = 0;
  };
  struct Counter : troupe::actors::Actor {
    std::promise<int>* total;
    int seen = 0;
    explicit Counter(std::promise<int>* t) : Actor("counter"), total(t) {
      on<Count>([this](Count& c) {
        if ((seen += c.n) == 5) total->set_value(seen);
      });
    }
  };
  std::promise<int> total;
  auto counted = total.get_future();
  auto system = troupe::ActorSystem::create();
  if (!system->spawn("counter", std::make_unique<Counter>(&total)) || !system->start() ||
      !system->tell("counter", Count{2}) || !system->tell("counter", Count{3}) ||
      counted.wait_for(std::chrono::seconds(30)) != std::future_status::ready) {
    std::fprintf(stderr, "the actor system did not deliver the counts\n");
    return 1;
  }
  std::printf("actor system: counted %d\n", counted.get());
  return system->stop() ? 0 : 1;
}
