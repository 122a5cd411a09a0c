#include "data/dataset.h"
#include "troupe/error.h"

namespace troupe::data {
namespace {

std::uint64_t mix64(std::uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}

}  // namespace

std::uint64_t SplitMix64::next() {
  state_ += 0x9E3779B97F4A7C15ULL;
  return mix64(state_);
}

std::uint64_t SplitMix64::below(std::uint64_t bound) {
  // Lemire's multiply-shift with rejection: exact, and the same on every platform.
  std::uint64_t x = next();
  unsigned __int128 m = static_cast<unsigned __int128>(x) * bound;
  auto low = static_cast<std::uint64_t>(m);
  if (low < bound) {
    const std::uint64_t threshold = (0 - bound) % bound;
    while (low < threshold) {
      x = next();
      m = static_cast<unsigned __int128>(x) * bound;
      low = static_cast<std::uint64_t>(m);
    }
  }
  return static_cast<std::uint64_t>(m >> 64);
}

void shuffle(std::vector<std::int64_t>& values, SplitMix64& rng) {
  for (std::size_t i = values.size(); i > 1; --i) {
    const std::size_t j = rng.below(i);
    std::swap(values[i - 1], values[j]);
  }
}

SplitMix64 recordRandom(std::uint64_t seed, std::int64_t epoch, std::int64_t index) {
  return SplitMix64(mix64(mix64(mix64(seed) + static_cast<std::uint64_t>(epoch)) ^
                          static_cast<std::uint64_t>(index)));
}

std::vector<std::int64_t> epochOrder(std::int64_t size, std::uint64_t seed, std::int64_t epoch) {
  if (size < 0) throw InputError(detail::concat("epochOrder: negative size ", size));
  std::vector<std::int64_t> order(static_cast<std::size_t>(size));
  for (std::int64_t i = 0; i < size; ++i)
    order[static_cast<std::size_t>(i)] = i;
  SplitMix64 rng(mix64(mix64(seed) + static_cast<std::uint64_t>(epoch)));
  shuffle(order, rng);
  return order;
}

}  // namespace troupe::data
