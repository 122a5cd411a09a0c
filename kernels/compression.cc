#include "kernels/compression.h"

#include <fmt/core.h>

#include <cstring>

#include "kernels/cpu/vec.h"
#include "troupe/error.h"

namespace troupe::kernels {

GradientCompression parseGradientCompression(const std::string& name) {
  if (const auto* type = valueNamed(kCompressions, name)) return *type;
  throw InputError("unknown gradient compression '" + name + "' (known: none, fp16, bf16, 2bit)");
}

std::string toString(GradientCompression type) {
  return nameIn(kCompressions, type);
}

std::string describe(const CompressionSpec& spec) {
  if (spec.type != GradientCompression::k2Bit) return toString(spec.type);
  return fmt::format("2bit(threshold={})", spec.threshold);
}

std::int64_t encodedBytes(GradientCompression type, std::int64_t n) {
  switch (type) {
    case GradientCompression::kFp16:
    case GradientCompression::kBf16:
      return 2 * n;
    case GradientCompression::k2Bit:
      return (n + 3) / 4;
    case GradientCompression::kNone:
      break;
  }
  return 4 * n;
}

Tensor encode(const CompressionSpec& spec, const float* x, float* residual, std::int64_t n) {
  Tensor out = Tensor::hostUninitialized({encodedBytes(spec.type, n)}, DType::kUInt8);
  auto* bytes = static_cast<std::uint8_t*>(out.raw());
  switch (spec.type) {
    case GradientCompression::kFp16:
      cpu::vec::toHalf(x, reinterpret_cast<std::uint16_t*>(bytes), n);
      break;
    case GradientCompression::kBf16:
      cpu::vec::toBfloat16(x, reinterpret_cast<std::uint16_t*>(bytes), n);
      break;
    case GradientCompression::k2Bit:
      TROUPE_ENFORCE(residual != nullptr, "2bit compression needs a residual");
      cpu::vec::quantize2Bit(x, residual, spec.threshold, bytes, n);
      break;
    case GradientCompression::kNone:
      std::memcpy(bytes, x, static_cast<std::size_t>(n) * sizeof(float));
      break;
  }
  return out;
}

void decode(const CompressionSpec& spec, const Tensor& bytes, float* y, std::int64_t n,
            bool accumulate) {
  const std::int64_t expected = encodedBytes(spec.type, n);
  // Nothing for nothing: an empty chunk's tensor may come off the wire with any type.
  if (n == 0 && bytes.numel() == 0) return;
  if (bytes.dtype() != DType::kUInt8 || bytes.numel() != expected) {
    throw InputError(fmt::format(
        "a {} compressed gradient of {} values must be {} bytes; got {} of another size or type",
        describe(spec), n, expected, static_cast<std::int64_t>(bytes.bytes())));
  }
  const auto* in = static_cast<const std::uint8_t*>(bytes.raw());
  switch (spec.type) {
    case GradientCompression::kFp16:
      cpu::vec::fromHalf(reinterpret_cast<const std::uint16_t*>(in), y, n, accumulate);
      break;
    case GradientCompression::kBf16:
      cpu::vec::fromBfloat16(reinterpret_cast<const std::uint16_t*>(in), y, n, accumulate);
      break;
    case GradientCompression::k2Bit:
      cpu::vec::dequantize2Bit(in, spec.threshold, y, n, accumulate);
      break;
    case GradientCompression::kNone: {
      const auto* f = reinterpret_cast<const float*>(in);
      if (accumulate) {
        cpu::vec::axpy(1.0f, f, y, n);
      } else {
        std::memcpy(y, f, static_cast<std::size_t>(n) * sizeof(float));
      }
      break;
    }
  }
}

}  // namespace troupe::kernels
