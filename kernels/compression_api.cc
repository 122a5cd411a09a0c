// troupe/compression.h: the transport's gradient compression (kernels/compression.h) for a
// caller's own exchange, errors as values.
#include "troupe/compression.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "kernels/compression.h"
#include "troupe/error.h"

namespace troupe {
namespace {

Status inputError(std::string message) {
  return {ErrorKind::kInput, std::move(message)};
}

Result<kernels::CompressionSpec> specOf(const std::string& type, float threshold) {
  kernels::CompressionSpec spec;
  try {
    spec.type = kernels::parseGradientCompression(type);
  } catch (const Error& e) {
    return inputError(e.what());
  }
  if (spec.type == kernels::GradientCompression::k2Bit &&
      !(std::isfinite(threshold) && threshold > 0)) {
    return inputError(
        fmt::format("2bit compression: threshold {} is not a finite number > 0", threshold));
  }
  spec.threshold = threshold;
  return spec;
}

}  // namespace

Result<std::int64_t> encodedSize(const std::string& type, std::int64_t n) {
  auto spec = specOf(type, 0.5f);
  if (!spec) return spec.status();
  if (n < 0) return inputError(fmt::format("encodedSize of {} values", n));
  return kernels::encodedBytes(spec->type, n);
}

Status encode(const std::string& type, float threshold, std::span<const float> values,
              std::span<float> residual, std::span<std::uint8_t> out) {
  auto spec = specOf(type, threshold);
  if (!spec) return spec.status();
  const auto n = static_cast<std::int64_t>(values.size());
  const auto bytes = kernels::encodedBytes(spec->type, n);
  if (static_cast<std::int64_t>(out.size()) != bytes) {
    return inputError(fmt::format("encode of {} values as {}: the output holds {} bytes, not {}", n,
                                  type, out.size(), bytes));
  }
  const bool two_bit = spec->type == kernels::GradientCompression::k2Bit;
  if (two_bit && residual.size() != values.size()) {
    return inputError(fmt::format("encode of {} values as 2bit: the residual holds {} values", n,
                                  residual.size()));
  }
  const kernels::Tensor encoded =
      kernels::encode(*spec, values.data(), two_bit ? residual.data() : nullptr, n);
  std::memcpy(out.data(), encoded.raw(), static_cast<std::size_t>(bytes));
  return {};
}

Status decode(const std::string& type, float threshold, std::span<const std::uint8_t> bytes,
              std::span<float> out, bool accumulate) {
  auto spec = specOf(type, threshold);
  if (!spec) return spec.status();
  const auto n = static_cast<std::int64_t>(out.size());
  if (static_cast<std::int64_t>(bytes.size()) != kernels::encodedBytes(spec->type, n)) {
    return inputError(fmt::format("decode of {} values as {}: {} bytes, not {}", n, type,
                                  bytes.size(), kernels::encodedBytes(spec->type, n)));
  }
  auto encoded = kernels::Tensor::hostUninitialized({static_cast<std::int64_t>(bytes.size())},
                                                    kernels::DType::kUInt8);
  std::memcpy(encoded.raw(), bytes.data(), bytes.size());
  try {
    kernels::decode(*spec, encoded, out.data(), n, accumulate);
  } catch (const Error& e) {
    return inputError(e.what());
  }
  return {};
}

}  // namespace troupe
