#include "data/db.h"

#include <filesystem>
#include <system_error>

#include "data/db_backends.h"
#include "troupe/error.h"

namespace troupe::data {

namespace fs = std::filesystem;

namespace {
std::string_view withArticle(DbType type) {
  return type == DbType::kLmdb ? "an lmdb" : "a leveldb";
}
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
  } else {
    fs::create_directories(path, ec);
    if (ec) {
      throw IoError(detail::concat("cannot create ", toString(type), " database folder '", path,
                                   "': ", ec.message()));
    }
  }
  return type == DbType::kLmdb ? internal::createLmdb(path) : internal::createLevelDb(path);
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
  return type == DbType::kLmdb ? internal::openLmdb(path) : internal::openLevelDb(path);
}

}  // namespace troupe::data
