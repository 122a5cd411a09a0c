// Gradient compression as troupe's transport does it, for an exchange of a caller's own (troupe's
// DDP communication hooks, python/troupe/hooks.py): a float32 array encoded into bytes and the
// bytes decoded back. Types: "none" (float32 as is), "fp16" and "bf16" (each value rounded to
// nearest even, 2 bytes), "2bit" (MXNet's: with threshold t, v = value + residual becomes +t,
// -t or 0, the rest kept in the residual for next time; 4 values a byte). Every receiver decodes
// the same bytes to the same floats. kInput for an unknown type, a threshold that is not a finite
// number > 0 (2bit) or buffers of the wrong sizes.
#pragma once

#include <cstdint>
#include <span>
#include <string>

#include "troupe/status.h"

namespace troupe {

// Bytes that `n` values take encoded as `type`.
Result<std::int64_t> encodedSize(const std::string& type, std::int64_t n);

// `values` encoded into `out` (encodedSize bytes). 2bit reads and updates `residual` (as many
// floats as values, zeros at first); the others leave it alone (it may be empty).
Status encode(const std::string& type, float threshold, std::span<const float> values,
              std::span<float> residual, std::span<std::uint8_t> out);

// `bytes` decoded into `out`: out = the values, or (accumulate) out += the values.
Status decode(const std::string& type, float threshold, std::span<const std::uint8_t> bytes,
              std::span<float> out, bool accumulate);

}  // namespace troupe
