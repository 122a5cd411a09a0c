// troupe::KVStore (include/troupe/kvstore.h), the local store: MXNet's push/pull semantics with and
// without an optimizer, gradient compression as pushes cross the wire, and bad calls answered with
// error values.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "troupe/kvstore.h"

namespace troupe {
namespace {

std::unique_ptr<KVStore> local() {
  auto kv = KVStore::create("local");
  EXPECT_TRUE(kv) << kv.status().message();
  return std::move(kv.value());
}

// One float operation's rounding, relative: u = 2^-24.
constexpr double kU = 1.0 / (1 << 24);

TEST(KVStoreLocal, WithoutAnOptimizerAPushOfSeveralArraysBecomesTheirSum) {
  auto kv = local();
  EXPECT_EQ(kv->type(), "local");
  EXPECT_EQ(kv->rank(), 0);
  EXPECT_EQ(kv->numWorkers(), 1);
  ASSERT_TRUE(kv->init(3, std::vector<float>{1, 1, 1}));
  std::vector<float> out(3);
  ASSERT_TRUE(kv->pull(3, out));
  EXPECT_EQ(out, (std::vector<float>{1, 1, 1}));
  const std::vector<float> a{1, 2, 3}, b{10, 20, 30};
  ASSERT_TRUE(kv->push(3, {a, b}));  // two devices' arrays
  ASSERT_TRUE(kv->pull(3, out));
  EXPECT_EQ(out, (std::vector<float>{11, 22, 33}));  // small integers: exact
  ASSERT_TRUE(kv->pushpull(3, a, out));
  EXPECT_EQ(out, a);
  ASSERT_TRUE(kv->barrier());
}

// SGD with momentum over two pushes, against the same arithmetic in double: each update is a few
// float operations per element, so the stored value differs from the double result by at most
// about 8 u times the magnitudes involved (|w| + lr |g'| + lr |v|), bound written per element.
TEST(KVStoreLocal, WithSgdEachPushUpdatesTheValueAsPyTorchsSgdDoes) {
  auto kv = local();
  const std::vector<float> w0{0.5f, -1.25f, 2.0f, 0.0f};
  ASSERT_TRUE(kv->init(7, w0));
  OptimizerSpec sgd;
  sgd.learning_rate = 0.1f;
  sgd.momentum = 0.9f;
  sgd.weight_decay = 0.01f;
  sgd.rescale_grad = 0.5f;
  ASSERT_TRUE(kv->setOptimizer(sgd)) << "valid";
  const std::vector<std::vector<float>> grads{{1.0f, -2.0f, 0.25f, 4.0f},
                                              {-0.5f, 1.0f, 3.0f, -1.0f}};
  std::vector<double> w(w0.begin(), w0.end()), v(w.size(), 0.0), bound(w.size(), 0.0);
  for (const auto& g : grads) {
    ASSERT_TRUE(kv->push(7, g));
    for (std::size_t i = 0; i < w.size(); ++i) {
      const double gp = 0.5 * g[i] + 0.01 * w[i];
      v[i] = 0.9 * v[i] + gp;
      w[i] -= 0.1 * v[i];
      bound[i] += 8 * kU * (std::abs(w[i]) + 0.1 * std::abs(gp) + 0.1 * std::abs(v[i]));
    }
  }
  std::vector<float> out(4);
  ASSERT_TRUE(kv->pull(7, out));
  for (std::size_t i = 0; i < w.size(); ++i)
    EXPECT_NEAR(out[i], w[i], bound[i] + std::numeric_limits<float>::denorm_min()) << i;
}

// MXNet's 2bit: with threshold 0.5, 0.3 sends 0 (residual 0.3); the next 0.3 makes 0.6, which
// sends +0.5 (residual 0.1); -0.7 sends -0.5 at once.
TEST(KVStoreLocal, TwoBitCompressionSendsThresholdsAndKeepsTheResidualPerKey) {
  auto kv = local();
  ASSERT_TRUE(kv->init(1, std::vector<float>{0, 0}));
  ASSERT_TRUE(kv->init(2, std::vector<float>{0, 0}));
  ASSERT_TRUE(kv->setGradientCompression("2bit", 0.5f));
  std::vector<float> out(2);
  ASSERT_TRUE(kv->pushpull(1, std::vector<float>{0.3f, -0.7f}, out));
  EXPECT_EQ(out, (std::vector<float>{0.0f, -0.5f}));
  ASSERT_TRUE(kv->pushpull(1, std::vector<float>{0.3f, 0.0f}, out));
  EXPECT_EQ(out, (std::vector<float>{0.5f, 0.0f}));
  // Key 2 has a residual of its own: its first 0.3 still sends 0.
  ASSERT_TRUE(kv->pushpull(2, std::vector<float>{0.3f, 0.0f}, out));
  EXPECT_EQ(out, (std::vector<float>{0.0f, 0.0f}));
}

TEST(KVStoreLocal, BadCallsAreErrorValuesNamingTheKey) {
  auto kv = local();
  ASSERT_TRUE(kv->init(5, std::vector<float>{1, 2}));
  std::vector<float> out(2), small(1);
  auto expect = [](const Status& s, ErrorKind kind, const std::string& message) {
    EXPECT_EQ(s.kind(), kind) << s.message();
    EXPECT_EQ(s.message(), message);
  };
  expect(kv->init(5, std::vector<float>{3, 4}), ErrorKind::kInput,
         "init of key 5: it has a value already");
  expect(kv->pull(9, out), ErrorKind::kInput,
         "pull of key 9: the key was never initialised (init it first)");
  expect(kv->push(9, std::vector<float>{1, 2}), ErrorKind::kInput,
         "push of key 9: the key was never initialised (init it first)");
  expect(kv->push(5, std::vector<float>{1, 2, 3}), ErrorKind::kInput,
         "push of key 5: array 0 has 3 values, the key's has 2");
  expect(kv->pull(5, small), ErrorKind::kInput,
         "pull of key 5: room for 1 values, the key's has 2");
  OptimizerSpec adamax;
  adamax.name = "adamax";
  expect(kv->setOptimizer(adamax), ErrorKind::kInput,
         "optimizer: unknown optimizer 'adamax' (known: sgd, adagrad, adam, adamw, lamb, lars, "
         "rmsprop)");
  OptimizerSpec bad_beta;
  bad_beta.name = "adam";
  bad_beta.beta2 = 1.0f;
  expect(kv->setOptimizer(bad_beta), ErrorKind::kInput,
         "optimizer: adam beta2 = 1 is outside [0, 1)");
  OptimizerSpec nan_lr;
  nan_lr.learning_rate = std::nanf("");
  EXPECT_EQ(kv->setOptimizer(nan_lr).kind(), ErrorKind::kInput);
  OptimizerSpec bad_momentum;
  bad_momentum.momentum = 1.5f;
  EXPECT_EQ(kv->setOptimizer(bad_momentum).kind(), ErrorKind::kInput);
  EXPECT_EQ(kv->setGradientCompression("3bit").kind(), ErrorKind::kInput);
  // Nothing of the refused calls changed the value.
  ASSERT_TRUE(kv->pull(5, out));
  EXPECT_EQ(out, (std::vector<float>{1, 2}));

  // A diverging update is a numeric error value.
  OptimizerSpec huge;
  huge.learning_rate = 3e38f;
  ASSERT_TRUE(kv->setOptimizer(huge));
  EXPECT_EQ(kv->push(5, std::vector<float>{1e30f, 1e30f}).kind(), ErrorKind::kNumeric);
}

TEST(KVStoreCreate, UnknownTypesAndTypesNotYetBuiltAreErrorValues) {
  auto unknown = KVStore::create("dist_sink");
  ASSERT_FALSE(unknown);
  EXPECT_EQ(unknown.status().message(),
            "unknown kvstore type 'dist_sink' (MXNet's: local, device, dist_sync, dist_async; "
            "troupe's: ring, ssp)");
  auto gpus = KVStore::create("dist_device_sync");
  ASSERT_FALSE(gpus);
  EXPECT_NE(gpus.status().message().find("needs GPUs, and this build has none"), std::string::npos);
  auto device = KVStore::create("device");  // no GPUs in this build: it sums as local does
  ASSERT_TRUE(device) << device.status().message();
  EXPECT_EQ(device.value()->type(), "device");
}

}  // namespace
}  // namespace troupe
