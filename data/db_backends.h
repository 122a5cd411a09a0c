// Private to data/: the backends behind createDb/openDb. Callers check the path first (db.cc).
#pragma once

#include <memory>
#include <string>

#include "data/db.h"

namespace troupe::data::internal {

std::unique_ptr<DbWriter> createLmdb(const std::string& path);
std::unique_ptr<DbReader> openLmdb(const std::string& path);
std::unique_ptr<DbWriter> createLevelDb(const std::string& path);
std::unique_ptr<DbReader> openLevelDb(const std::string& path);

}  // namespace troupe::data::internal
