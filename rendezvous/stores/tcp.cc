// tcp://HOST:PORT: a client of the embedded TCP store (rendezvous/tcp_store.h), whose server the
// launcher runs, or rank 0 when the processes are started by hand.
#include "rendezvous/tcp_store.h"
#include "rendezvous/url.h"

namespace troupe::rendezvous {

StoreBackend tcpStoreBackend() {
  return {
      .scheme = "tcp",
      .form = "tcp://HOST:PORT",
      .summary = "troupe's embedded store, served by the launcher or rank 0",
      .parse = [](std::string_view url, std::string_view rest,
                  StoreUrl& out) { parseHostPort(url, rest, -1, out); },
      .open =
          [](const StoreUrl& url, std::chrono::milliseconds timeout, const std::string& secret) {
            return connectTcpStore(url.host, url.port, timeout, secret);
          },
      .embedded = true};
}

}  // namespace troupe::rendezvous
