#include "data/db.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <system_error>

#include "data/db_backends.h"
#include "troupe/error.h"

namespace troupe::data {

namespace fs = std::filesystem;

namespace {
internal::DbBackend backendOf(DbType type) {
  return type == DbType::kLmdb ? internal::lmdb() : internal::levelDb();
}

std::string_view withArticle(DbType type) {
  return type == DbType::kLmdb ? "an lmdb" : "a leveldb";
}

// createDb's writer: the backend's, in a staging folder that publish() renames to the path.
class StagedWriter final : public DbWriter {
 public:
  StagedWriter(std::string path, fs::path staging, DbType type)
      : path_(std::move(path)), staging_(std::move(staging)) {
    backend_ = backendOf(type).create(staging_.string());
  }
  ~StagedWriter() override {
    if (published_) return;
    backend_.reset();
    std::error_code ec;
    fs::remove_all(staging_, ec);
  }

  void put(std::string_view key, std::string_view value) override {
    TROUPE_ENFORCE(backend_, "a put into database '", path_, "' after its publish()");
    backend_->put(key, value);
  }

  void publish() override {
    TROUPE_ENFORCE(backend_, "database '", path_, "' published twice");
    backend_->commit();
    backend_.reset();
    // Onto a missing path, or an empty folder (which rename replaces).
    if (::rename(staging_.c_str(), path_.c_str()) != 0) {
      throw IoError(detail::concat("cannot publish database '", path_, "' (from '",
                                   staging_.string(), "'): ", std::strerror(errno)));
    }
    published_ = true;
    const fs::path parent = staging_.has_parent_path() ? staging_.parent_path() : fs::path(".");
    const int fd = ::open(parent.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd >= 0) {
      ::fsync(fd);
      ::close(fd);
    }
  }

 private:
  std::string path_;
  fs::path staging_;
  std::unique_ptr<internal::BackendWriter> backend_;
  bool published_ = false;
};
}  // namespace

DbType parseDbType(std::string_view name) {
  if (name == "lmdb") return DbType::kLmdb;
  if (name == "leveldb") return DbType::kLevelDb;
  throw InputError(
      detail::concat("unknown database type '", name, "' (known types: lmdb, leveldb)"));
}

std::string_view toString(DbType type) {
  return type == DbType::kLmdb ? "lmdb" : "leveldb";
}

std::optional<DbType> detectDbType(const std::string& path) {
  std::error_code ec;
  if (!fs::is_directory(path, ec)) return std::nullopt;
  if (fs::exists(fs::path(path) / "data.mdb", ec)) return DbType::kLmdb;
  if (fs::exists(fs::path(path) / "CURRENT", ec)) return DbType::kLevelDb;
  for (fs::directory_iterator it(path, ec), end; !ec && it != end; it.increment(ec)) {
    if (it->path().filename().string().starts_with("MANIFEST-")) return DbType::kLevelDb;
  }
  return std::nullopt;
}

std::unique_ptr<DbWriter> createDb(const std::string& path, DbType type) {
  std::error_code ec;
  const auto status = fs::status(path, ec);
  if (fs::exists(status)) {
    if (!fs::is_directory(status)) {
      throw InputError(detail::concat("cannot create ", toString(type), " database '", path,
                                      "': a file of that name exists"));
    }
    if (auto found = detectDbType(path)) {
      throw InputError(detail::concat("cannot create ", toString(type), " database '", path,
                                      "': ", withArticle(*found), " database exists there"));
    }
    if (!fs::is_empty(path, ec)) {
      throw InputError(detail::concat("cannot create ", toString(type), " database '", path,
                                      "': the folder exists and is not empty"));
    }
  }
  fs::path target = fs::path(path).lexically_normal();
  if (!target.has_filename()) target = target.parent_path();
  const fs::path staging = target.parent_path() /
                           detail::concat(".", target.filename().string(), ".partial-", ::getpid());
  fs::remove_all(staging, ec);  // a folder of an earlier process with this pid
  fs::create_directories(staging, ec);
  if (ec) {
    throw IoError(detail::concat("cannot create ", toString(type), " database folder '",
                                 staging.string(), "' (for '", path, "'): ", ec.message()));
  }
  try {
    return std::make_unique<StagedWriter>(path, staging, type);
  } catch (...) {
    fs::remove_all(staging, ec);
    throw;
  }
}

std::unique_ptr<DbReader> openDb(const std::string& path, DbType type) {
  std::error_code ec;
  const auto status = fs::status(path, ec);
  if (!fs::exists(status)) {
    throw InputError(detail::concat(toString(type), " database '", path, "' does not exist"));
  }
  if (!fs::is_directory(status)) {
    throw InputError(detail::concat("database '", path, "' is not ", withArticle(type),
                                    " database (it is a file; a database is a folder)"));
  }
  const auto found = detectDbType(path);
  if (!found) {
    throw InputError(detail::concat("database '", path, "' is not ", withArticle(type),
                                    " database (the folder holds neither data.mdb nor "
                                    "CURRENT/MANIFEST-*)"));
  }
  if (*found != type) {
    throw InputError(detail::concat("database '", path, "' is not ", withArticle(type),
                                    " database (it looks like ", toString(*found), ")"));
  }
  return backendOf(type).open(path);
}

}  // namespace troupe::data
