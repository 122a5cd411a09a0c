// Gradient compression's encodings (kernels/compression.h).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>

#include "kernels/compression.h"
#include "troupe/error.h"

namespace troupe::kernels {
namespace {

std::vector<float> roundTrip(GradientCompression type, const std::vector<float>& x) {
  const CompressionSpec spec{type, 0.5f};
  Tensor bytes = encode(spec, x.data(), nullptr, static_cast<std::int64_t>(x.size()));
  EXPECT_EQ(bytes.numel(), encodedBytes(type, static_cast<std::int64_t>(x.size())));
  std::vector<float> y(x.size(), 0.0f);
  decode(spec, bytes, y.data(), static_cast<std::int64_t>(y.size()), false);
  return y;
}

TEST(Compression, HalfPrecisionsKeepValuesTheyCanRepresentExactly) {
  const std::vector<float> x{0.0f, -0.0f, 1.0f, -2.5f, 0.125f, 65504.0f, -1024.0f};
  EXPECT_EQ(roundTrip(GradientCompression::kFp16, x), x);
  auto y = roundTrip(GradientCompression::kBf16, {0.0f, 1.0f, -2.5f, 0.125f, -1024.0f});
  EXPECT_EQ(y, (std::vector<float>{0.0f, 1.0f, -2.5f, 0.125f, -1024.0f}));
}

TEST(Compression, HalfPrecisionsRoundToNearestEven) {
  // 1 + 2^-11 lies halfway between fp16's 1 and 1 + 2^-10: even is 1. 1 + 3 * 2^-11 rounds up.
  auto h = roundTrip(GradientCompression::kFp16, {1.0f + 0x1p-11f, 1.0f + 3 * 0x1p-11f});
  EXPECT_EQ(h[0], 1.0f);
  EXPECT_EQ(h[1], 1.0f + 0x1p-9f);
  // bfloat16 keeps 8 bits of mantissa: 1 + 2^-8 is halfway (even: 1), 1 + 3 * 2^-8 rounds up.
  auto b = roundTrip(GradientCompression::kBf16, {1.0f + 0x1p-8f, 1.0f + 3 * 0x1p-8f});
  EXPECT_EQ(b[0], 1.0f);
  EXPECT_EQ(b[1], 1.0f + 0x1p-6f);
}

TEST(Compression, NonFiniteValuesStayNonFiniteSoTheUpdaterStillCatchesThem) {
  const float inf = std::numeric_limits<float>::infinity();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  for (auto type : {GradientCompression::kFp16, GradientCompression::kBf16}) {
    auto y = roundTrip(type, {nan, inf, -inf});
    EXPECT_TRUE(std::isnan(y[0])) << toString(type);
    EXPECT_EQ(y[1], inf) << toString(type);
    EXPECT_EQ(y[2], -inf) << toString(type);
  }
  // fp16's largest value is 65504: a gradient beyond it overflows to inf, not to a wrong number.
  EXPECT_EQ(roundTrip(GradientCompression::kFp16, {1e6f})[0], inf);
}

// MXNet's 2-bit semantics: +t, -t or 0, and the residual carries the rest to the next time.
TEST(Compression, TwoBitSendsPlusOrMinusTheThresholdAndKeepsTheRest) {
  const CompressionSpec spec{GradientCompression::k2Bit, 0.5f};
  std::vector<float> g{0.6f, -0.7f, 0.2f, 0.3f, -0.5f}, residual(5, 0.0f), y(5);
  Tensor bytes = encode(spec, g.data(), residual.data(), 5);
  EXPECT_EQ(bytes.numel(), 2);  // four values a byte
  decode(spec, bytes, y.data(), 5, false);
  EXPECT_EQ(y, (std::vector<float>{0.5f, -0.5f, 0.0f, 0.0f, -0.5f}));
  for (std::size_t i = 0; i < 5; ++i)
    EXPECT_FLOAT_EQ(residual[i], g[i] - y[i]) << i;
  // Next time the same gradient: 0.2 + 0.2 and 0.3 + 0.3 reach the threshold.
  bytes = encode(spec, g.data(), residual.data(), 5);
  decode(spec, bytes, y.data(), 5, false);
  EXPECT_EQ(y, (std::vector<float>{0.5f, -0.5f, 0.0f, 0.5f, -0.5f}));
  // Decoding can add to what is there.
  std::vector<float> acc(5, 1.0f);
  decode(spec, bytes, acc.data(), 5, true);
  EXPECT_EQ(acc, (std::vector<float>{1.5f, 0.5f, 1.0f, 1.5f, 0.5f}));
}

TEST(Compression, ABufferOfTheWrongSizeIsAnErrorNotARead) {
  const CompressionSpec spec{GradientCompression::kFp16, 0.5f};
  std::vector<float> x(10, 1.0f), y(10);
  Tensor bytes = encode(spec, x.data(), nullptr, 10);
  EXPECT_THROW(decode(spec, bytes, y.data(), 11, false), InputError);
  Tensor floats = Tensor::host({10});
  EXPECT_THROW(decode(spec, floats, y.data(), 10, false), InputError);
}

TEST(Compression, NamesParseAndUnknownOnesAreListed) {
  EXPECT_EQ(parseGradientCompression("2bit"), GradientCompression::k2Bit);
  EXPECT_EQ(describe({GradientCompression::k2Bit, 0.25f}), "2bit(threshold=0.25)");
  try {
    parseGradientCompression("1bit");
    FAIL() << "1bit accepted";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("known: none, fp16, bf16, 2bit"), std::string::npos);
  }
}

}  // namespace
}  // namespace troupe::kernels
