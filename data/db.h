// Key-value databases holding training records: LMDB and LevelDB, as Caffe writes them.
//
// A database is a folder: LMDB keeps data.mdb and lock.mdb in it, LevelDB keeps CURRENT,
// MANIFEST-* and its tables. Keys are compared bytewise, so both kinds list keys in the same order.
//
// Errors: opening a missing path, or a path that holds the other kind of database, throws
// InputError naming the path and the type asked for. A failing system call (disk full, no write
// permission) throws IoError naming the path.
// Thread safety: a reader may be used from one thread at a time, any thread (its LMDB read
// transaction is not tied to a thread); open one reader per thread. A writer must be used from one
// thread only (LMDB ties a write transaction to its thread). Several readers of one database in one
// process are fine, sharing what it allows once in a process (LMDB's environment, LevelDB's DB);
// so are readers in several processes of an LMDB, but a LevelDB opens in one process at a time
// (its LOCK file: the second process's open says so). No writer may work on it meanwhile.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace troupe::data {

enum class DbType { kLmdb, kLevelDb };

// "lmdb" or "leveldb"; anything else throws InputError listing both.
DbType parseDbType(std::string_view name);
std::string_view toString(DbType type);

// The kind of database in folder path, judged by the files present (data.mdb for LMDB, CURRENT or
// MANIFEST-* for LevelDB); nullopt if path is missing or holds neither. Never throws.
std::optional<DbType> detectDbType(const std::string& path);

// A new database, written in a staging folder beside its path (".NAME.partial-PID") and moved
// to its path whole by publish(): until then no reader finds it, and a writer destroyed before
// publish() (a conversion that failed half way, an exception) removes the staging folder with what
// was put, so that no half-written database is ever there to train on. Used from one thread.
class DbWriter {
 public:
  virtual ~DbWriter() = default;
  // Puts are buffered and committed every kCommitEvery puts. A key put twice keeps the last value.
  virtual void put(std::string_view key, std::string_view value) = 0;
  // Makes every put durable (committed and synced to disk), closes the database and moves it to
  // its path; the writer takes no put after it. Throws IoError naming the path on failure (the
  // staging folder is then removed by the destructor).
  virtual void publish() = 0;

  static constexpr int kCommitEvery = 1000;
};

// Creates a new database for path (and its parent folders); refuses (InputError) if path exists
// and is not an empty folder, and throws IoError if a folder cannot be created or written.
// LMDB maps up to 1 TiB of address space (sparse: the file grows only as records are written).
std::unique_ptr<DbWriter> createDb(const std::string& path, DbType type);

class DbReader {
 public:
  virtual ~DbReader() = default;
  // The path the reader was opened on.
  virtual const std::string& path() const = 0;
  virtual std::int64_t size() const = 0;
  // All keys in database order.
  virtual std::vector<std::string> keys() const = 0;
  // The value under key; throws InputError naming the database and key if it is absent.
  virtual std::string get(std::string_view key) const = 0;
  // As get(), without a copy where the backend allows it (LMDB returns a view into its memory
  // map; LevelDB into a buffer the reader owns). The view stays valid until the next call to
  // peek() or until the reader is destroyed.
  virtual std::string_view peek(std::string_view key) = 0;
  // Every value in key order (the order of keys()) as views that stay valid until the reader is
  // destroyed, where the backend has them without copying: LMDB's views into its memory map, so
  // that a record is read by position with no key lookup. Empty where it has not (LevelDB).
  virtual std::vector<std::string_view> values() const { return {}; }
};

// Opens an existing database for reading. LMDB readers keep one read transaction open for their
// lifetime, so they see the database as it was when opened.
std::unique_ptr<DbReader> openDb(const std::string& path, DbType type);

}  // namespace troupe::data
