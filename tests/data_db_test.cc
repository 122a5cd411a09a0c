#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <fmt/core.h>

#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <thread>
#include <vector>

#include "data/db.h"
#include "data_test_util.h"
#include "troupe/error.h"

namespace troupe::data {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using namespace testing;

class DbTest : public ::testing::TestWithParam<DbType> {};

TEST_P(DbTest, RoundTripsRecordsAcrossBatchCommitsInKeyOrder) {
  TempDir dir;
  const std::string path = dir / "db";
  const int n = 2 * DbWriter::kCommitEvery + 17;  // several automatic commits and a last one
  {
    auto writer = createDb(path, GetParam());
    for (int i = n - 1; i >= 0; --i) {  // written backwards: the DB orders keys itself
      writer->put(fmt::format("{:08d}", i), testing::pattern(100 + i % 50, i));
    }
    writer->publish();
  }
  EXPECT_EQ(detectDbType(path), GetParam());
  auto reader = openDb(path, GetParam());
  EXPECT_EQ(reader->path(), path);
  ASSERT_EQ(reader->size(), n);
  const auto keys = reader->keys();
  ASSERT_EQ(keys.size(), static_cast<std::size_t>(n));
  for (int i = 0; i < n; ++i) {
    ASSERT_EQ(keys[i], fmt::format("{:08d}", i));
    const std::string expected = testing::pattern(100 + i % 50, i);
    ASSERT_EQ(reader->get(keys[i]), expected);
    ASSERT_EQ(reader->peek(keys[i]), expected);
  }
}

TEST_P(DbTest, BinaryKeysAndValuesSurviveUnchanged) {
  TempDir dir;
  const std::string key("a\0b\xff", 4);
  const std::string value("\0\x01\x02\xfe", 4);
  {
    auto writer = createDb(dir / "db", GetParam());
    writer->put(key, value);
    writer->put("z", "");
    writer->publish();
  }
  auto reader = openDb(dir / "db", GetParam());
  EXPECT_EQ(reader->keys(), (std::vector<std::string>{key, "z"}));
  EXPECT_EQ(reader->get(key), value);
  EXPECT_EQ(reader->get("z"), "");
}

// A conversion that fails half way (its writer dropped unpublished) leaves no database at its
// path, nor anything beside it; until publish() no reader finds one.
TEST_P(DbTest, AWriterDroppedBeforeItsPublishLeavesNoDatabase) {
  TempDir dir;
  {
    auto writer = createDb(dir / "db", GetParam());
    writer->put("only", "value");
    EXPECT_FALSE(std::filesystem::exists(dir / "db")) << "visible before its publish()";
  }
  EXPECT_FALSE(std::filesystem::exists(dir / "db"));
  EXPECT_TRUE(std::filesystem::is_empty(dir.str())) << "the staging folder was left behind";
  {
    auto writer = createDb(dir / "db", GetParam());
    writer->put("only", "value");
    writer->publish();
    EXPECT_THROW(writer->put("more", "value"), InvariantError);
  }
  EXPECT_EQ(openDb(dir / "db", GetParam())->get("only"), "value");
  EXPECT_EQ(std::distance(std::filesystem::directory_iterator(dir.str()), {}), 1);
}

TEST_P(DbTest, MissingKeyNamesDatabaseAndKey) {
  TempDir dir;
  createDb(dir / "db", GetParam())->publish();
  auto reader = openDb(dir / "db", GetParam());
  EXPECT_EQ(reader->size(), 0);
  EXPECT_TRUE(reader->keys().empty());
  EXPECT_THROW(reader->get("nope"), InputError);
  EXPECT_THAT(errorOf([&] { reader->peek("nope"); }),
              AllOf(HasSubstr(dir / "db"), HasSubstr("'nope'")));
}

TEST_P(DbTest, OpeningAMissingPathNamesPathAndType) {
  TempDir dir;
  const std::string path = dir / "x/train";
  EXPECT_THROW(openDb(path, GetParam()), InputError);
  EXPECT_THAT(errorOf([&] { openDb(path, GetParam()); }),
              AllOf(HasSubstr("'" + path + "'"), HasSubstr(std::string(toString(GetParam()))),
                    HasSubstr("does not exist")));
}

TEST_P(DbTest, OpeningAFolderWithoutDatabaseFails) {
  TempDir dir;
  std::filesystem::create_directory(dir / "empty");
  EXPECT_THROW(openDb(dir / "empty", GetParam()), InputError);
  std::ofstream(dir / "file") << "x";
  EXPECT_THAT(errorOf([&] { openDb(dir / "file", GetParam()); }), HasSubstr(dir / "file"));
}

TEST_P(DbTest, CreateRefusesAnExistingDatabaseOrFile) {
  TempDir dir;
  createDb(dir / "db", GetParam())->publish();
  EXPECT_THROW(createDb(dir / "db", GetParam()), InputError);
  EXPECT_THAT(errorOf([&] { createDb(dir / "db", DbType::kLmdb); }),
              AllOf(HasSubstr(dir / "db"), HasSubstr("exists")));
  EXPECT_THAT(errorOf([&] { createDb(dir / "db", DbType::kLevelDb); }),
              AllOf(HasSubstr(dir / "db"), HasSubstr("exists")));
  std::ofstream(dir / "file") << "x";
  EXPECT_THROW(createDb(dir / "file", GetParam()), InputError);
  // An empty folder is fine, and so are missing parents.
  std::filesystem::create_directory(dir / "empty");
  createDb(dir / "empty", GetParam())->publish();
  createDb(dir / "a/b/c", GetParam())->publish();
  EXPECT_EQ(detectDbType(dir / "a/b/c"), GetParam());
}

TEST_P(DbTest, CreateUnderAFileIsAnIoErrorNamingThePath) {
  TempDir dir;
  std::ofstream(dir / "file") << "x";
  const std::string path = dir / "file" + "/db";
  EXPECT_THROW(createDb(path, GetParam()), IoError);
  EXPECT_THAT(errorOf([&] { createDb(path, GetParam()); }), HasSubstr(path));
}

INSTANTIATE_TEST_SUITE_P(Backends, DbTest, ::testing::Values(DbType::kLmdb, DbType::kLevelDb),
                         [](const auto& info) { return std::string(toString(info.param)); });

// Readers of one database in one process (a process's replicas evaluating on the same test data,
// its readers) open and close it at once from many threads, sharing what the database allows
// once in a process (LMDB's environment, LevelDB's DB). Each reader sees every record. Two LMDB
// environments of one database in one process deadlocked on its reader table's mutex; a second
// LevelDB reader failed ("LOCK: already held by process").
TEST_P(DbTest, ManyReadersOfOneDatabaseOpenAndCloseAtOnceFromManyThreads) {
  TempDir dir;
  const std::string path = dir / "db";
  {
    auto writer = createDb(path, GetParam());
    for (int i = 0; i < 100; ++i)
      writer->put(fmt::format("{:04d}", i), testing::pattern(64, i));
    writer->publish();
  }
  std::atomic<int> wrong{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&, t] {
      for (int round = 0; round < 50; ++round) {
        auto reader = openDb(path, GetParam());
        auto other = openDb(path, GetParam());  // two at once in one thread
        const int i = (t * 50 + round) % 100;
        if (reader->size() != 100 || other->size() != 100 ||
            reader->get(fmt::format("{:04d}", i)) != testing::pattern(64, i)) {
          ++wrong;
        }
      }
    });
  }
  for (auto& thread : threads)
    thread.join();
  EXPECT_EQ(wrong.load(), 0);
}

// LevelDB opens a database in one process at a time: a second process is told so, and how to
// read it from several.
TEST(LevelDbReaders, ASecondProcessIsToldAnotherHasTheDatabaseOpen) {
  TempDir dir;
  const std::string path = dir / "db";
  {
    auto writer = createDb(path, DbType::kLevelDb);
    writer->put("a", "b");
    writer->publish();
  }
  int ready[2], done[2];
  ASSERT_EQ(::pipe(ready), 0);
  ASSERT_EQ(::pipe(done), 0);
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {  // holds the database open until the parent has tried
    auto reader = openDb(path, DbType::kLevelDb);
    char c = 1;
    if (::write(ready[1], &c, 1) != 1) ::_exit(1);
    if (::read(done[0], &c, 1) != 1) ::_exit(1);
    ::_exit(0);
  }
  char c = 0;
  ASSERT_EQ(::read(ready[0], &c, 1), 1);
  const std::string error = errorOf([&] { openDb(path, DbType::kLevelDb); });
  EXPECT_THAT(error, AllOf(HasSubstr(path), HasSubstr("another process has it open"),
                           HasSubstr("use an LMDB")));
  EXPECT_EQ(::write(done[1], &c, 1), 1);
  int status = 0;
  ::waitpid(child, &status, 0);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
}

TEST(DbTypeTest, OpeningAnLmdbAsLevelDbSaysWhatItLooksLike) {
  TempDir dir;
  const std::string path = dir / "train";
  createDb(path, DbType::kLmdb)->publish();
  EXPECT_THROW(openDb(path, DbType::kLevelDb), InputError);
  EXPECT_EQ(errorOf([&] { openDb(path, DbType::kLevelDb); }),
            "database '" + path + "' is not a leveldb database (it looks like lmdb)");
}

TEST(DbTypeTest, OpeningALevelDbAsLmdbSaysWhatItLooksLike) {
  TempDir dir;
  const std::string path = dir / "train";
  createDb(path, DbType::kLevelDb)->publish();
  EXPECT_EQ(errorOf([&] { openDb(path, DbType::kLmdb); }),
            "database '" + path + "' is not an lmdb database (it looks like leveldb)");
}

TEST(DbTypeTest, ParsesKnownNamesAndListsThemOtherwise) {
  EXPECT_EQ(parseDbType("lmdb"), DbType::kLmdb);
  EXPECT_EQ(parseDbType("leveldb"), DbType::kLevelDb);
  EXPECT_EQ(toString(DbType::kLmdb), "lmdb");
  EXPECT_EQ(toString(DbType::kLevelDb), "leveldb");
  EXPECT_THROW(parseDbType("rocksdb"), InputError);
  EXPECT_THAT(errorOf([] { parseDbType("rocksdb"); }),
              AllOf(HasSubstr("'rocksdb'"), HasSubstr("lmdb"), HasSubstr("leveldb")));
}

TEST(DbTypeTest, DetectsNothingWhereThereIsNoDatabase) {
  TempDir dir;
  EXPECT_EQ(detectDbType(dir / "missing"), std::nullopt);
  EXPECT_EQ(detectDbType(dir.str()), std::nullopt);
}

}  // namespace
}  // namespace troupe::data
