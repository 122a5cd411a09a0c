// RedisStore against a real redis-server: passwords and unreachable servers.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <chrono>
#include <string>

#include <fmt/format.h>

#include "redis_util.h"
#include "rendezvous/redis_store.h"
#include "rendezvous/url.h"
#include "rendezvous_util.h"
#include "troupe/error.h"

namespace troupe::rendezvous {
namespace {

using namespace testing;
using std::chrono::milliseconds;
using ::testing::HasSubstr;

class RedisPasswordTest : public ::testing::Test {
 protected:
  void SetUp() override {
    try {
      server_ = std::make_unique<testing::RedisServer>("right-password");
    } catch (const std::exception& e) {
      FAIL() << e.what();
    }
  }
  RedisOptions options(std::string password) const {
    RedisOptions o;
    o.port = server_->port();
    o.password = std::move(password);
    o.connect_timeout = kLong;
    return o;
  }
  std::string address() const { return fmt::format("127.0.0.1:{}", server_->port()); }
  std::unique_ptr<testing::RedisServer> server_;
};

TEST_F(RedisPasswordTest, WrongPasswordFailsNamingHostAndPort) {
  const auto start = Clock::now();
  try {
    connectRedisStore(options("wrong-password"));
    FAIL() << "connected with a wrong password";
  } catch (const InputError& e) {
    EXPECT_THAT(e.what(), HasSubstr(address()));
    EXPECT_THAT(e.what(), HasSubstr("authentication failed"));
  }
  EXPECT_LT(Clock::now() - start, milliseconds(1000)) << "a wrong password must not be retried";
}

TEST_F(RedisPasswordTest, MissingPasswordFailsSayingOneIsNeeded) {
  auto store = connectRedisStore(options(""));
  try {
    store->set("k", "v");
    FAIL() << "wrote without a password";
  } catch (const InputError& e) {
    EXPECT_THAT(e.what(), HasSubstr(address()));
    EXPECT_THAT(e.what(), HasSubstr("requires a password"));
  }
}

TEST_F(RedisPasswordTest, RightPasswordFromTheUrlWorks) {
  auto store = openStore(fmt::format("redis://:right-password@{}", address()), kLong);
  store->set("k", std::string("\0v", 2));
  EXPECT_EQ(store->get("k", kShort), std::string("\0v", 2));
}

TEST(RedisStoreTest, ConnectTimesOutNamingHostAndPort) {
  RedisOptions o;
  o.port = testing::freeLoopbackPort();
  o.connect_timeout = kShort;
  try {
    connectRedisStore(o);
    FAIL() << "connected to nothing";
  } catch (const TimeoutError& e) {
    EXPECT_THAT(e.what(), HasSubstr(fmt::format("127.0.0.1:{}", o.port)));
  }
}

TEST(RedisStoreTest, AServerThatGoesAwayGivesAnIoError) {
  auto server = std::make_unique<testing::RedisServer>();
  RedisOptions o;
  o.port = server->port();
  o.connect_timeout = kShort;
  auto store = connectRedisStore(o);
  store->set("k", "v");
  server.reset();
  EXPECT_THROW(store->get("k", kShort), IoError);
}

}  // namespace
}  // namespace troupe::rendezvous
