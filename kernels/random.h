// The one PRNG of the kernels: a counter-based SplitMix64 hash, so a random number is a pure
// function of (seed, stream, index) and results never depend on thread count or call order.
// Floats take the top 24 bits, so they are exact and identical on every platform and device.
#pragma once

#include <cstdint>

namespace troupe::kernels {

constexpr std::uint64_t mix64(std::uint64_t z) {
  z += 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// A 64-bit random word for element `index` of stream `stream` under `seed`.
constexpr std::uint64_t randomBits(std::uint64_t seed, std::uint64_t stream, std::uint64_t index) {
  return mix64(mix64(mix64(seed) ^ stream) + index);
}

// Uniform in [0, 1), a multiple of 2^-24.
constexpr float uniform01(std::uint64_t bits) {
  return static_cast<float>(bits >> 40) * (1.0f / 16777216.0f);
}

}  // namespace troupe::kernels
