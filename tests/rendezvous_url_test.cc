// openStore's URL forms, and the store each opens.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <stdlib.h>

#include <filesystem>
#include <set>
#include <string>

#include <fmt/format.h>

#include "redis_util.h"
#include "rendezvous/tcp_store.h"
#include "rendezvous/url.h"
#include "rendezvous_util.h"
#include "troupe/error.h"

namespace troupe::rendezvous {
namespace {

using namespace testing;
using std::chrono::milliseconds;
using ::testing::HasSubstr;
using ::testing::Not;

TEST(StoreUrlTest, ParsesTcp) {
  const auto u = parseStoreUrl("tcp://node-7.cluster:29500");
  EXPECT_EQ(u.backend->scheme, "tcp");
  EXPECT_EQ(u.host, "node-7.cluster");
  EXPECT_EQ(u.port, 29500);
  const auto v6 = parseStoreUrl("tcp://[::1]:1");
  EXPECT_EQ(v6.host, "::1");
  EXPECT_EQ(v6.port, 1);
}

TEST(StoreUrlTest, ParsesFile) {
  const auto u = parseStoreUrl("file:///shared/dir");
  EXPECT_EQ(u.backend->scheme, "file");
  EXPECT_EQ(u.path, "/shared/dir");
}

TEST(StoreUrlTest, ParsesRedisWithAndWithoutPasswordAndPort) {
  const auto plain = parseStoreUrl("redis://cache");
  EXPECT_EQ(plain.backend->scheme, "redis");
  EXPECT_EQ(plain.host, "cache");
  EXPECT_EQ(plain.port, 6379);
  EXPECT_EQ(plain.password, "");
  const auto full = parseStoreUrl("redis://:s3cret@10.1.2.3:7000");
  EXPECT_EQ(full.host, "10.1.2.3");
  EXPECT_EQ(full.port, 7000);
  EXPECT_EQ(full.password, "s3cret");
  const auto at_sign = parseStoreUrl("redis://:p@ss:word@cache");
  EXPECT_EQ(at_sign.password, "p@ss:word");
  EXPECT_EQ(at_sign.host, "cache");
  EXPECT_EQ(at_sign.port, 6379);
}

TEST(StoreUrlTest, RejectsBadUrlsNamingThemAndTheAcceptedForms) {
  for (const std::string url :
       {"", "localhost:29500", "http://host:80", "tcp://host", "tcp://:29500", "tcp://host:0",
        "tcp://host:65536", "tcp://host:12ab", "tcp://host:", "tcp://[::1", "file://relative/dir",
        "file:///", "redis://", "redis://host:x", "TCP://host:1"}) {
    try {
      parseStoreUrl(url);
      ADD_FAILURE() << "accepted '" << url << "'";
    } catch (const InputError& e) {
      EXPECT_THAT(e.what(), HasSubstr("'" + url + "'"));
      EXPECT_THAT(e.what(), HasSubstr("accepted forms: tcp://HOST:PORT, file:///shared/dir, "
                                      "redis://[:PASSWORD@]HOST[:PORT]"));
    }
  }
}

TEST(StoreUrlTest, MasksTheRedisPasswordInErrors) {
  try {
    parseStoreUrl("redis://:hunter2@host:99999");
    FAIL() << "accepted a bad port";
  } catch (const InputError& e) {
    EXPECT_THAT(e.what(), HasSubstr("redis://***@host:99999"));
    EXPECT_THAT(e.what(), Not(HasSubstr("hunter2")));
  }
  try {
    parseStoreUrl("redis://admin:hunter2@host");
    FAIL() << "accepted a user name";
  } catch (const InputError& e) {
    EXPECT_THAT(e.what(), HasSubstr("'redis://***@host'"));
    EXPECT_THAT(e.what(), HasSubstr(":PASSWORD@"));
    EXPECT_THAT(e.what(), Not(HasSubstr("hunter2")));
  }
}

TEST(OpenStoreTest, OpensEachBackend) {
  auto server = startTcpStoreServer("127.0.0.1", 0);
  auto tcp = openStore(fmt::format("tcp://127.0.0.1:{}", server->port()), kLong);
  EXPECT_THAT(tcp->describe(), HasSubstr("tcp store"));

  auto dir = (std::filesystem::temp_directory_path() / "troupe-url-XXXXXX").string();
  ASSERT_NE(::mkdtemp(dir.data()), nullptr);
  auto file = openStore("file://" + dir + "/nested", kLong);
  EXPECT_THAT(file->describe(), HasSubstr("file store"));

  auto& redis_server = testing::sharedRedisServer();
  auto redis = openStore(fmt::format("redis://127.0.0.1:{}", redis_server.port()), kLong);
  EXPECT_THAT(redis->describe(), HasSubstr("redis store"));

  for (Store* store : {tcp.get(), file.get(), redis.get()}) {
    store->set("url-test", "v");
    EXPECT_EQ(store->get("url-test", kLong), "v") << store->describe();
    store->remove("url-test");
  }
  std::filesystem::remove_all(dir);
}

TEST(OpenStoreTest, RejectsAnUnknownScheme) {
  EXPECT_THROW(openStore("nope://host:2379", kLong), InputError);
}

TEST(StoreBackends, EachIsListedOnceWithAFormOfItsSchemeThatItParses) {
  std::set<std::string_view> schemes;
  for (const auto& backend : storeBackends()) {
    EXPECT_TRUE(schemes.insert(backend.scheme).second) << backend.scheme;
    EXPECT_TRUE(backend.form.starts_with(std::string(backend.scheme) + "://")) << backend.form;
    EXPECT_FALSE(backend.summary.empty()) << backend.scheme;
    EXPECT_THAT(storeUrlForms(), HasSubstr(backend.form));
  }
  for (const std::string_view scheme : {"tcp", "file", "redis"})
    EXPECT_TRUE(schemes.count(scheme)) << scheme;
}

TEST(StoreBackends, AnyUrlsUserInformationIsRedacted) {
  EXPECT_EQ(redactedStoreUrl("redis://:pw@host:1"), "redis://***@host:1");
  EXPECT_EQ(redactedStoreUrl("redis://:p@ss@host"), "redis://***@host");
  EXPECT_EQ(redactedStoreUrl("etcd://user:pw@host"), "etcd://***@host");
  EXPECT_EQ(redactedStoreUrl("redis:///pw@host"), "redis://***@host");  // not a path
  EXPECT_EQ(redactedStoreUrl("redis://:a://b@host"), "redis://***@host");
  EXPECT_EQ(redactedStoreUrl("tcp://host:29500"), "tcp://host:29500");
}

}  // namespace
}  // namespace troupe::rendezvous
