#include <gtest/gtest.h>

#include "kernels/tensor.h"
#include "troupe/error.h"

namespace troupe::kernels {
namespace {

TEST(Tensor, SliceSharesStorageWithItsSource) {
  auto t = Tensor::host({2, 3});
  auto s = t.slice(3, 6);
  s.f32()[0] = 5.0f;
  EXPECT_EQ(t.f32()[3], 5.0f);
  EXPECT_EQ(s.numel(), 3);
}

TEST(Tensor, SliceOutOfRangeThrowsNamingTheRange) {
  auto t = Tensor::host({4});
  try {
    t.slice(2, 5);
    FAIL() << "slice past the end did not throw";
  } catch (const InvariantError& e) {
    EXPECT_NE(std::string(e.what()).find("slice [2,5)"), std::string::npos) << e.what();
  }
}

TEST(Tensor, ViewKeepsElementCount) {
  auto t = Tensor::host({2, 3});
  EXPECT_EQ(t.view({6}).numel(), 6);
  EXPECT_THROW(t.view({5}), InvariantError);
}

TEST(Tensor, AnAllocationTheHostCannotMakeIsAResourceErrorNamingItsSize) {
  // 256 TiB: more than x86-64's 128 TiB of user address space, so aligned_alloc fails whatever
  // the overcommit policy.
  try {
    Tensor::host({std::int64_t{1} << 46});
    FAIL() << "a 256 TiB tensor was allocated";
  } catch (const ResourceError& e) {
    EXPECT_NE(std::string(e.what()).find("281474976710656 bytes"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("batch_size"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace troupe::kernels
