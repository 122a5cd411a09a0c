// A standalone parameter-server service: one server of a distributed KVStore (dist_sync,
// dist_async or ssp), for workers that run elsewhere (such as examples/kvstore_softmax), started by
// hand, by a service manager or by any launcher. It serves its share of the keys until every
// worker is done with the store, then exits 0; on an error it prints the error, which names the
// culprit (a worker that is gone, a setting), and exits 1.
//
//   ps_service [--kvstore dist_sync] [--workers W --servers S --index I]
//              [--rendezvous tcp://HOST:PORT --run_id ID] [--secret_file FILE]
//
// A flag given sets the KVStore setting of the same meaning (troupe's config keys num_shards,
// num_servers, shard_id, rendezvous, run_id, secret_file); the others come from the launcher's
// variables (TROUPE_*) or MXNet's (DMLC_NUM_WORKER, DMLC_NUM_SERVER, DMLC_SERVER_ID,
// DMLC_PS_ROOT_URI and DMLC_PS_ROOT_PORT), as for any program on troupe::KVStore. Worker 0 serves
// the rendezvous store at the address given, so the workers can start in any order with the
// servers.
#include <troupe/kvstore.h>
#include <troupe/version.h>

#include <cstdio>
#include <map>
#include <string>

int main(int argc, char** argv) {
  // Flags and the settings they give.
  const std::map<std::string, std::string> keys = {
      {"--workers", "num_shards"}, {"--servers", "num_servers"},
      {"--index", "shard_id"},     {"--rendezvous", "rendezvous"},
      {"--run_id", "run_id"},      {"--secret_file", "secret_file"}};
  std::string type = "dist_sync";
  troupe::KVStoreSettings settings{{"role", "server"}};
  for (int i = 1; i < argc; i += 2) {
    const std::string flag = argv[i];
    if (i + 1 >= argc) {
      std::fprintf(stderr, "ps_service: %s needs a value\n", flag.c_str());
      return 2;
    }
    if (flag == "--kvstore") {
      type = argv[i + 1];
    } else if (const auto key = keys.find(flag); key != keys.end()) {
      settings[key->second] = argv[i + 1];
    } else {
      std::fprintf(stderr, "ps_service: unknown flag %s\n", flag.c_str());
      return 2;
    }
  }
  std::printf("%s; parameter server of a %s store\n", troupe::buildSummary().c_str(), type.c_str());
  std::fflush(stdout);
  const troupe::Status served = troupe::KVStore::runServer(type, settings);
  if (!served) {
    std::fprintf(stderr, "ps_service: %s\n", served.message().c_str());
    return 1;
  }
  std::printf("ps_service: every worker is done\n");
  return 0;
}
