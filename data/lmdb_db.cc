#include <lmdb.h>

#include <cerrno>
#include <filesystem>
#include <memory>

#include "data/db_backends.h"
#include "troupe/error.h"

namespace troupe::data::internal {
namespace {

constexpr std::size_t kMapSize = std::size_t{1} << 40;  // 1 TiB of address space, sparse
constexpr unsigned kMaxReaders = 1024;

[[noreturn]] void fail(int rc, const std::string& path, std::string_view what) {
  const std::string message =
      detail::concat("lmdb database '", path, "': ", what, " failed: ", mdb_strerror(rc));
  if (rc == MDB_NOTFOUND || rc == MDB_CORRUPTED || rc == MDB_INVALID ||
      rc == MDB_VERSION_MISMATCH) {
    throw InputError(message);
  }
  throw IoError(message);
}

void check(int rc, const std::string& path, std::string_view what) {
  if (rc != MDB_SUCCESS) [[unlikely]]
    fail(rc, path, what);
}

MDB_val toVal(std::string_view bytes) {
  return MDB_val{bytes.size(), const_cast<char*>(bytes.data())};
}

std::string_view toView(const MDB_val& val) {
  return {static_cast<const char*>(val.mv_data), val.mv_size};
}

class LmdbWriter final : public BackendWriter {
 public:
  explicit LmdbWriter(std::string path) : path_(std::move(path)) {
    check(mdb_env_create(&env_), path_, "mdb_env_create");
    try {
      check(mdb_env_set_mapsize(env_, kMapSize), path_, "mdb_env_set_mapsize");
      // Batches commit without fsync; commit() syncs, so durability is tied to commit().
      check(mdb_env_open(env_, path_.c_str(), MDB_NOSYNC, 0664), path_, "mdb_env_open");
    } catch (...) {
      mdb_env_close(env_);
      throw;
    }
  }

  ~LmdbWriter() override {
    if (txn_) mdb_txn_abort(txn_);
    mdb_env_close(env_);
  }

  void put(std::string_view key, std::string_view value) override {
    if (!txn_) begin();
    MDB_val k = toVal(key);
    MDB_val v = toVal(value);
    check(mdb_put(txn_, dbi_, &k, &v, 0), path_, "mdb_put");
    if (++pending_ >= DbWriter::kCommitEvery) commitTxn();
  }

  void commit() override {
    if (txn_) commitTxn();
    check(mdb_env_sync(env_, 1), path_, "mdb_env_sync");
  }

 private:
  void begin() {
    check(mdb_txn_begin(env_, nullptr, 0, &txn_), path_, "mdb_txn_begin");
    int rc = mdb_dbi_open(txn_, nullptr, 0, &dbi_);
    if (rc != MDB_SUCCESS) {
      mdb_txn_abort(txn_);
      txn_ = nullptr;
      fail(rc, path_, "mdb_dbi_open");
    }
  }

  void commitTxn() {
    MDB_txn* txn = txn_;
    txn_ = nullptr;
    pending_ = 0;
    check(mdb_txn_commit(txn), path_, "mdb_txn_commit");
  }

  std::string path_;
  MDB_env* env_ = nullptr;
  MDB_txn* txn_ = nullptr;
  MDB_dbi dbi_ = 0;
  int pending_ = 0;
};

// A database's read-only environment, shared by its readers in the process
// (sharedPerDatabase), each with a read transaction of its own.
class LmdbEnv {
 public:
  explicit LmdbEnv(const std::string& path) {
    check(mdb_env_create(&env_), path, "mdb_env_create");
    // The reader table holds a slot per read transaction of every process of the host: LMDB's 126
    // would not last 16 processes of 8 replicas each (a reader and a test set each). It takes
    // effect where this process is the first to open the database.
    check(mdb_env_set_maxreaders(env_, kMaxReaders), path, "mdb_env_set_maxreaders");
    // MDB_NOTLS: a read transaction is not tied to the thread that began it, and a thread may
    // hold several (of several readers).
    int rc = mdb_env_open(env_, path.c_str(), MDB_RDONLY | MDB_NOTLS, 0664);
    if (rc == EACCES || rc == EROFS) {
      // A read-only folder without lock.mdb (e.g. a data set installed by a package).
      mdb_env_close(env_);
      env_ = nullptr;
      check(mdb_env_create(&env_), path, "mdb_env_create");
      rc = mdb_env_open(env_, path.c_str(), MDB_RDONLY | MDB_NOTLS | MDB_NOLOCK, 0664);
    }
    if (rc != MDB_SUCCESS) {
      mdb_env_close(env_);
      fail(rc, path, "mdb_env_open");
    }
    try {
      checkWhole(path);
    } catch (...) {
      mdb_env_close(env_);
      throw;
    }
    // Slots that killed processes left (a restarted worker's) are freed, or they would fill
    // the table and pin old snapshots.
    int dead = 0;
    mdb_reader_check(env_, &dead);
  }
  ~LmdbEnv() { mdb_env_close(env_); }
  LmdbEnv(const LmdbEnv&) = delete;
  LmdbEnv& operator=(const LmdbEnv&) = delete;
  MDB_env* get() const { return env_; }

 private:
  // The map reaches past the end of a truncated data.mdb (a copy cut short, a full disk): a read
  // of a page beyond the file's end is a SIGBUS that no error handling catches. Every page the
  // last transaction used must lie within the file.
  void checkWhole(const std::string& path) const {
    MDB_envinfo info;
    MDB_stat stat;
    check(mdb_env_info(env_, &info), path, "mdb_env_info");
    check(mdb_env_stat(env_, &stat), path, "mdb_env_stat");
    const auto needed = (static_cast<std::uint64_t>(info.me_last_pgno) + 1) * stat.ms_psize;
    std::error_code ec;
    const auto file = (std::filesystem::path(path) / "data.mdb").string();
    const auto size = std::filesystem::file_size(file, ec);
    if (ec) throw IoError(detail::concat("lmdb database '", path, "': ", file, ": ", ec.message()));
    if (size < needed) {
      throw InputError(detail::concat("lmdb database '", path, "' is truncated: its data.mdb has ",
                                      size, " bytes, but its pages reach byte ", needed,
                                      " (copy it again, or convert it again)"));
    }
  }

  MDB_env* env_ = nullptr;
};

class LmdbReader final : public DbReader {
 public:
  explicit LmdbReader(std::string path)
      : path_(std::move(path)), env_(sharedPerDatabase<LmdbEnv>(path_, [](const std::string& p) {
          return new LmdbEnv(p);
        })) {
    try {
      check(mdb_txn_begin(env_->get(), nullptr, MDB_RDONLY, &txn_), path_, "mdb_txn_begin");
      check(mdb_dbi_open(txn_, nullptr, 0, &dbi_), path_, "mdb_dbi_open");
      MDB_stat stat;
      check(mdb_stat(txn_, dbi_, &stat), path_, "mdb_stat");
      size_ = static_cast<std::int64_t>(stat.ms_entries);
    } catch (...) {
      if (txn_) mdb_txn_abort(txn_);
      throw;
    }
  }

  ~LmdbReader() override { mdb_txn_abort(txn_); }

  const std::string& path() const override { return path_; }
  std::int64_t size() const override { return size_; }

  std::vector<std::string> keys() const override {
    std::vector<std::string> keys;
    keys.reserve(static_cast<std::size_t>(size_));
    walk("reading keys", [&](const MDB_val& k, const MDB_val&) { keys.emplace_back(toView(k)); });
    return keys;
  }

  // The views stay valid while the read transaction is open: it is read-only, and it lives as
  // long as the reader.
  std::vector<std::string_view> values() const override {
    std::vector<std::string_view> values;
    values.reserve(static_cast<std::size_t>(size_));
    walk("reading values", [&](const MDB_val&, const MDB_val& v) { values.push_back(toView(v)); });
    return values;
  }

  std::string get(std::string_view key) const override { return std::string(lookup(key)); }
  std::string_view peek(std::string_view key) override { return lookup(key); }

 private:
  // Calls fn(key, value) for every record in key order.
  template <typename Fn>
  void walk(std::string_view what, const Fn& fn) const {
    MDB_cursor* cursor = nullptr;
    check(mdb_cursor_open(txn_, dbi_, &cursor), path_, "mdb_cursor_open");
    MDB_val k, v;
    int rc = mdb_cursor_get(cursor, &k, &v, MDB_FIRST);
    while (rc == MDB_SUCCESS) {
      fn(k, v);
      rc = mdb_cursor_get(cursor, &k, &v, MDB_NEXT);
    }
    mdb_cursor_close(cursor);
    if (rc != MDB_NOTFOUND) fail(rc, path_, what);
  }

  std::string_view lookup(std::string_view key) const {
    MDB_val k = toVal(key);
    MDB_val v;
    const int rc = mdb_get(txn_, dbi_, &k, &v);
    if (rc == MDB_NOTFOUND) [[unlikely]] {
      throw InputError(detail::concat("lmdb database '", path_, "' has no key '", key, "'"));
    }
    check(rc, path_, "mdb_get");
    return toView(v);
  }

  std::string path_;
  std::shared_ptr<LmdbEnv> env_;  // before txn_: the transaction ends before its environment
  MDB_txn* txn_ = nullptr;
  MDB_dbi dbi_ = 0;
  std::int64_t size_ = 0;
};

}  // namespace

DbBackend lmdb() {
  return backendWith<LmdbWriter, LmdbReader>();
}

}  // namespace troupe::data::internal
