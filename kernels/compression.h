// Gradient compression for the wire (MXNet's kvstore.set_gradient_compression, plus half
// precisions): what a worker sends of a gradient, and how a receiver adds it back in float.
//  - none: float32 as is.
//  - fp16 / bf16: each value rounded to nearest even, 2 bytes; no residual.
//  - 2bit (MXNet's): with threshold t, v = g + residual becomes +t (v >= t), -t (v <= -t) or 0,
//    and the sender keeps v minus that as its residual for the same elements next time; 4 values
//    a byte.
// Encoding is done where the bytes leave (ring hops, pushes to servers); every rank decodes the
// same bytes to the same floats.
#pragma once

#include <cstdint>
#include <string>

#include "kernels/named.h"
#include "kernels/tensor.h"

namespace troupe::kernels {

enum class GradientCompression : std::uint8_t { kNone = 0, kFp16 = 1, kBf16 = 2, k2Bit = 3 };

struct CompressionSpec {
  GradientCompression type = GradientCompression::kNone;
  float threshold = 0.5f;  // 2bit only; MXNet's default
  bool operator==(const CompressionSpec&) const = default;
};

inline constexpr Named<GradientCompression> kCompressions[] = {
    {"none", GradientCompression::kNone},
    {"fp16", GradientCompression::kFp16},
    {"bf16", GradientCompression::kBf16},
    {"2bit", GradientCompression::k2Bit}};
// "none", "fp16", "bf16", "2bit"; parse throws InputError naming the known ones.
GradientCompression parseGradientCompression(const std::string& name);
std::string toString(GradientCompression type);
// "2bit(threshold=0.5)", "fp16", ...: for logs and the run's plan.
std::string describe(const CompressionSpec& spec);

// Bytes that n encoded values take.
std::int64_t encodedBytes(GradientCompression type, std::int64_t n);

// Encodes x[0, n) into a new uint8 tensor of encodedBytes(n). `residual` (2bit only; n floats,
// zero at first) is read and updated.
Tensor encode(const CompressionSpec& spec, const float* x, float* residual, std::int64_t n);

// Decodes `bytes` (uint8, exactly encodedBytes(n)) into y[0, n): y = values, or y += values.
// Throws InputError when the size does not match (a malformed or foreign message).
void decode(const CompressionSpec& spec, const Tensor& bytes, float* y, std::int64_t n,
            bool accumulate);

}  // namespace troupe::kernels
