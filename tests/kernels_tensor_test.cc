#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>

#include "kernels/backend.h"
#include "kernels/host_memory.h"
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

TEST(Tensor, OnlyADefaultTensorIsUndefined) {
  EXPECT_FALSE(Tensor().defined());
  const Tensor empty = Tensor::host({0});
  EXPECT_TRUE(empty.defined());
  EXPECT_EQ(empty.numel(), 0);
  EXPECT_TRUE(Tensor::host({3}).slice(1, 1).defined());
  EXPECT_TRUE(Tensor::host({2, 2}).defined());
}

// Every host tensor's bytes (rounded up to 64) are counted while its storage lives, views and
// copies of the handle included once, and the peak keeps the most. (This test's thread makes the
// only tensors meanwhile: the suite's binaries run one test at a time.)
TEST(Tensor, HostTensorMemoryCountsEachStorageWhileItLives) {
  const std::int64_t before = HostTensorMemory::inUse();
  HostTensorMemory::resetPeak();
  {
    const Tensor a = Tensor::host({1000});  // 4000 bytes, 4032 counted
    const Tensor view = a.slice(10, 20);
    const Tensor b = Tensor::hostUninitialized({3}, DType::kUInt8);  // 64
    EXPECT_EQ(HostTensorMemory::inUse(), before + 4032 + 64);
  }
  EXPECT_EQ(HostTensorMemory::inUse(), before);
  EXPECT_EQ(HostTensorMemory::peak(), before + 4032 + 64);
  HostTensorMemory::resetPeak();
  EXPECT_EQ(HostTensorMemory::peak(), before);
}

// setLimit: an allocation past the limit fails, naming the tensor, the bytes in use with it and
// the setting, and counts nothing; others go on; limit 0 lifts it.
TEST(Tensor, AnAllocationPastTheHostTensorLimitIsAResourceErrorAndCountsNothing) {
  const std::int64_t before = HostTensorMemory::inUse();
  HostTensorMemory::setLimit(before + 8192, "max_memory X (test)");
  const Tensor a = Tensor::host({1000});  // 4032 counted: within
  try {
    Tensor::host({2, 1000});  // 8000 more: 12032 past `before`
    FAIL() << "an allocation past the limit was made";
  } catch (const ResourceError& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find("would hold " + std::to_string(before + 4032 + 8000) + " bytes"),
              std::string::npos)
        << message;
    EXPECT_NE(message.find("a tensor of shape [2,1000] (8000 bytes)"), std::string::npos)
        << message;
    EXPECT_NE(message.find("more than max_memory X (test)"), std::string::npos) << message;
  }
  EXPECT_EQ(HostTensorMemory::inUse(), before + 4032);
  const Tensor b = Tensor::host({1000});  // within it: 8064 of 8192
  EXPECT_EQ(HostTensorMemory::inUse(), before + 8064);
  HostTensorMemory::setLimit(0, "");
  const Tensor c = Tensor::host({2, 1000});
  EXPECT_EQ(HostTensorMemory::inUse(), before + 8064 + 8000);
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

namespace reduced {

using troupe::kernels::DType;
using troupe::kernels::fromBFloat16;
using troupe::kernels::fromFloat16;
using troupe::kernels::Tensor;
using troupe::kernels::toBFloat16;
using troupe::kernels::toFloat16;

// IEEE binary16's landmarks, each rounding to nearest with ties to even.
TEST(ReducedPrecision, Float16RoundsToNearestEven) {
  EXPECT_EQ(toFloat16(1.0f), 0x3c00);
  EXPECT_EQ(toFloat16(-2.0f), 0xc000);
  EXPECT_EQ(toFloat16(-0.0f), 0x8000);
  EXPECT_EQ(toFloat16(65504.0f), 0x7bff);                      // the largest
  EXPECT_EQ(toFloat16(65519.0f), 0x7bff);                      // below the halfway point to 2^16
  EXPECT_EQ(toFloat16(65520.0f), 0x7c00);                      // the tie goes to even: inf
  EXPECT_EQ(toFloat16(1e30f), 0x7c00);                         // beyond: inf
  EXPECT_EQ(toFloat16(std::ldexp(1.0f, -14)), 0x0400);         // the smallest normal
  EXPECT_EQ(toFloat16(std::ldexp(1.0f, -24)), 0x0001);         // the smallest subnormal
  EXPECT_EQ(toFloat16(std::ldexp(1.0f, -25)), 0x0000);         // half of it: the tie to even 0
  EXPECT_EQ(toFloat16(std::ldexp(3.0f, -25)), 0x0002);         // 1.5 steps: the tie to even 2
  EXPECT_EQ(toFloat16(1.0f + std::ldexp(1.0f, -11)), 0x3c00);  // a tie: down to even
  EXPECT_EQ(toFloat16(1.0f + std::ldexp(3.0f, -11)), 0x3c02);  // a tie: up to even
  EXPECT_EQ(toFloat16(1.0f + std::ldexp(1.0f, -12) + std::ldexp(1.0f, -11)), 0x3c01);
  EXPECT_EQ(toFloat16(std::ldexp(1.0f, -14) - std::ldexp(1.0f, -26)), 0x0400);  // rounds up
  EXPECT_EQ(toFloat16(std::numeric_limits<float>::infinity()), 0x7c00);
  EXPECT_TRUE(std::isnan(fromFloat16(toFloat16(std::numeric_limits<float>::quiet_NaN()))));
}

// Every float16 that is not NaN widens exactly and narrows back to itself.
TEST(ReducedPrecision, EveryFloat16RoundTripsThroughFloat32) {
  for (std::uint32_t bits = 0; bits < 0x10000u; ++bits) {
    const auto h = static_cast<std::uint16_t>(bits);
    if ((h & 0x7c00u) == 0x7c00u && (h & 0x3ffu) != 0) continue;  // NaN
    ASSERT_EQ(toFloat16(fromFloat16(h)), h) << "bits " << bits;
  }
  EXPECT_EQ(fromFloat16(0x7bff), 65504.0f);
  EXPECT_EQ(fromFloat16(0x0001), std::ldexp(1.0f, -24));
  EXPECT_EQ(fromFloat16(0x3555), 0.333251953125f);
}

TEST(ReducedPrecision, BFloat16KeepsTheTopHalfRoundedToNearestEven) {
  EXPECT_EQ(toBFloat16(1.0f), 0x3f80);
  EXPECT_EQ(toBFloat16(1.0f + std::ldexp(1.0f, -8)), 0x3f80);  // a tie: down to even
  EXPECT_EQ(toBFloat16(1.0f + std::ldexp(3.0f, -8)), 0x3f82);  // a tie: up to even
  EXPECT_EQ(toBFloat16(1.0f + std::ldexp(1.0f, -8) + std::ldexp(1.0f, -20)), 0x3f81);
  EXPECT_EQ(toBFloat16(3e38f), 0x7f62);  // float32's range: no overflow below its largest
  EXPECT_EQ(toBFloat16(std::numeric_limits<float>::max()), 0x7f80);  // rounds up to inf
  EXPECT_TRUE(std::isnan(fromBFloat16(toBFloat16(std::numeric_limits<float>::quiet_NaN()))));
  for (std::uint32_t bits = 0; bits < 0x10000u; ++bits) {
    const auto h = static_cast<std::uint16_t>(bits);
    if ((h & 0x7f80u) == 0x7f80u && (h & 0x7fu) != 0) continue;  // NaN
    ASSERT_EQ(toBFloat16(fromBFloat16(h)), h) << "bits " << bits;
  }
}

// The CPU backend casts (it computes in float32 only) and finds inf and NaN among float32s.
TEST(ReducedPrecision, TheCpuBackendCastsAndTestsFiniteness) {
  auto cpu = troupe::kernels::makeCpuBackend(2);
  const std::int64_t n = 100000;  // several threads' ranges
  auto x = Tensor::host({n});
  for (std::int64_t i = 0; i < n; ++i)
    x.f32()[i] = static_cast<float>(i % 977) * 0.37f - 100.0f;
  auto h = Tensor::host({n}, DType::kFloat16), b = Tensor::host({n}, DType::kBFloat16);
  auto back = Tensor::host({n});
  cpu->cast(x, h);
  cpu->cast(x, b);
  cpu->cast(h, back);
  for (std::int64_t i = 0; i < n; ++i) {
    ASSERT_EQ(static_cast<const std::uint16_t*>(h.raw())[i], toFloat16(x.f32()[i]));
    ASSERT_EQ(static_cast<const std::uint16_t*>(b.raw())[i], toBFloat16(x.f32()[i]));
    ASSERT_EQ(back.f32()[i], fromFloat16(toFloat16(x.f32()[i])));
  }
  auto y = Tensor::host({7});
  EXPECT_TRUE(cpu->allFinite({x, y}));
  x.f32()[n - 1] = std::numeric_limits<float>::infinity();
  EXPECT_FALSE(cpu->allFinite({y, x}));
  x.f32()[n - 1] = 0.0f;
  y.f32()[3] = std::numeric_limits<float>::quiet_NaN();
  EXPECT_FALSE(cpu->allFinite({x, y}));
  EXPECT_THROW(cpu->cast(x, Tensor::host({n}, DType::kInt32)), troupe::InvariantError);
}

}  // namespace reduced
