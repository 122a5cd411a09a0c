// Private to data/: the backends behind createDb/openDb. Callers check the path first (db.cc).
#pragma once

#include <filesystem>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <system_error>

#include "data/db.h"

namespace troupe::data::internal {

// The databases of type T open in the process: one mutex and map per T, whatever opens them.
template <typename T>
struct OpenDatabases {
  struct Entry {
    T* opened = nullptr;
    int users = 0;
  };
  // Never destroyed: a reader that a static owns may close its database at exit, after the
  // statics made before it are gone.
  static std::mutex& mutex() {
    static auto* m = new std::mutex;
    return *m;
  }
  static std::map<std::string, Entry>& entries() {
    static auto* e = new std::map<std::string, Entry>;
    return *e;
  }
};

// What open(path) returns (a new T), made once per database in the process and shared by its
// readers (a process's replicas, its evaluations): LMDB allows one environment per database in a
// process (its locks are the process's: a second one re-initialises the first's reader table),
// and LevelDB one open DB (its LOCK file: "already held by process"). The last handle closes it,
// under the mutex that opens, so that no open overlaps a close.
template <typename T, typename Open>
std::shared_ptr<T> sharedPerDatabase(const std::string& path, Open open) {
  using Registry = OpenDatabases<T>;
  std::error_code ec;
  std::string key = std::filesystem::weakly_canonical(path, ec).string();
  if (ec || key.empty()) key = path;
  std::lock_guard lock(Registry::mutex());
  auto& entry = Registry::entries()[key];
  if (!entry.opened) {
    try {
      entry.opened = open(path);
    } catch (...) {
      Registry::entries().erase(key);
      throw;
    }
  }
  ++entry.users;
  return std::shared_ptr<T>(entry.opened, [key](T*) {
    std::lock_guard closing(Registry::mutex());
    const auto it = Registry::entries().find(key);
    if (--it->second.users == 0) {
      delete it->second.opened;
      Registry::entries().erase(it);
    }
  });
}

// A backend's writer at one folder: puts, and a commit that makes them durable. Destroying it
// closes the database without committing what is buffered (createDb's writer removes it then).
class BackendWriter {
 public:
  virtual ~BackendWriter() = default;
  virtual void put(std::string_view key, std::string_view value) = 0;
  virtual void commit() = 0;
};

// A backend: its writer of a new database at a folder, and its reader of an existing one.
struct DbBackend {
  std::unique_ptr<BackendWriter> (*create)(const std::string& path);
  std::unique_ptr<DbReader> (*open)(const std::string& path);
};
template <class Writer, class Reader>
DbBackend backendWith() {
  return {[](const std::string& path) -> std::unique_ptr<BackendWriter> {
            return std::make_unique<Writer>(path);
          },
          [](const std::string& path) -> std::unique_ptr<DbReader> {
            return std::make_unique<Reader>(path);
          }};
}
DbBackend lmdb();
DbBackend levelDb();

}  // namespace troupe::data::internal
