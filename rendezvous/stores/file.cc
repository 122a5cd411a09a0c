// file:///shared/dir: a FileStore (rendezvous/file_store.h) on a folder every process sees.
#include "rendezvous/file_store.h"
#include "rendezvous/url.h"

namespace troupe::rendezvous {

StoreBackend fileStoreBackend() {
  return {.scheme = "file",
          .form = "file:///shared/dir",
          .summary = "a folder every process sees (NFS or one host)",
          .parse =
              [](std::string_view url, std::string_view rest, StoreUrl& out) {
                if (!rest.starts_with('/'))
                  badStoreUrl(url, "a file store needs an absolute path (file:///dir)");
                if (rest.size() == 1) badStoreUrl(url, "a file store needs a folder, not '/'");
                out.path = std::string(rest);
              },
          .open = [](const StoreUrl& url, std::chrono::milliseconds,
                     const std::string&) { return openFileStore(url.path); }};
}

}  // namespace troupe::rendezvous
