#include <leveldb/db.h>
#include <leveldb/write_batch.h>

#include "data/db_backends.h"
#include "troupe/error.h"

namespace troupe::data::internal {
namespace {

[[noreturn]] void fail(const leveldb::Status& status, const std::string& path,
                       std::string_view what) {
  const std::string message =
      detail::concat("leveldb database '", path, "': ", what, " failed: ", status.ToString());
  if (status.IsCorruption() || status.IsInvalidArgument() || status.IsNotFound()) {
    throw InputError(message);
  }
  throw IoError(message);
}

void check(const leveldb::Status& status, const std::string& path, std::string_view what) {
  if (!status.ok()) [[unlikely]]
    fail(status, path, what);
}

leveldb::Slice toSlice(std::string_view bytes) {
  return {bytes.data(), bytes.size()};
}

class LevelDbWriter final : public BackendWriter {
 public:
  explicit LevelDbWriter(std::string path) : path_(std::move(path)) {
    leveldb::Options options;
    options.create_if_missing = true;
    options.error_if_exists = true;
    options.write_buffer_size = 256 << 20;  // as Caffe
    leveldb::DB* db = nullptr;
    check(leveldb::DB::Open(options, path_, &db), path_, "open for writing");
    db_.reset(db);
  }

  void put(std::string_view key, std::string_view value) override {
    batch_.Put(toSlice(key), toSlice(value));
    if (++pending_ >= DbWriter::kCommitEvery) write(false);
  }

  void commit() override { write(true); }

 private:
  void write(bool sync) {
    leveldb::WriteOptions options;
    options.sync = sync;
    pending_ = 0;
    const leveldb::Status status = db_->Write(options, &batch_);
    batch_.Clear();
    check(status, path_, "write");
  }

  std::string path_;
  std::unique_ptr<leveldb::DB> db_;
  leveldb::WriteBatch batch_;
  int pending_ = 0;
};

class LevelDbReader final : public DbReader {
 public:
  // The database open once in the process for all its readers (sharedPerDatabase): LevelDB's
  // reads are safe from several threads at once.
  explicit LevelDbReader(std::string path)
      : path_(std::move(path)), db_(sharedPerDatabase<leveldb::DB>(path_, [](const std::string& p) {
          leveldb::Options options;
          options.create_if_missing = false;
          options.max_open_files = 100;  // as Caffe
          leveldb::DB* db = nullptr;
          const leveldb::Status status = leveldb::DB::Open(options, p, &db);
          // LevelDB locks a database for one process (its LOCK file), readers too.
          if (status.IsIOError() && status.ToString().find("/LOCK") != std::string::npos) {
            throw IoError(detail::concat(
                "leveldb database '", p, "': another process has it open (", status.ToString(),
                "); LevelDB lets one process at a time read it: give each process its copy, or "
                "use an LMDB, which many processes read at once"));
          }
          check(status, p, "open");
          return db;
        })) {
    size_ = static_cast<std::int64_t>(keys().size());
  }

  const std::string& path() const override { return path_; }
  std::int64_t size() const override { return size_; }

  std::vector<std::string> keys() const override {
    std::vector<std::string> keys;
    leveldb::ReadOptions options;
    options.fill_cache = false;
    std::unique_ptr<leveldb::Iterator> it(db_->NewIterator(options));
    for (it->SeekToFirst(); it->Valid(); it->Next())
      keys.emplace_back(it->key().ToString());
    check(it->status(), path_, "reading keys");
    return keys;
  }

  std::string get(std::string_view key) const override {
    std::string value;
    lookup(key, &value);
    return value;
  }

  std::string_view peek(std::string_view key) override {
    lookup(key, &buffer_);
    return buffer_;
  }

 private:
  void lookup(std::string_view key, std::string* value) const {
    const leveldb::Status status = db_->Get(leveldb::ReadOptions(), toSlice(key), value);
    if (status.IsNotFound()) [[unlikely]] {
      throw InputError(detail::concat("leveldb database '", path_, "' has no key '", key, "'"));
    }
    check(status, path_, "get");
  }

  std::string path_;
  std::shared_ptr<leveldb::DB> db_;
  std::int64_t size_ = 0;
  std::string buffer_;
};

}  // namespace

DbBackend levelDb() {
  return backendWith<LevelDbWriter, LevelDbReader>();
}

}  // namespace troupe::data::internal
