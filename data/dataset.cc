#include "data/dataset.h"

#include "data/datum.h"
#include "data/memory_dataset.h"
#include "troupe/error.h"

namespace troupe::data {
namespace {

class DbDataset final : public Dataset {
 public:
  explicit DbDataset(const DatasetOptions& options) : options_(options), decoder_(options) {
    if (options_.channels <= 0 || options_.height <= 0 || options_.width <= 0) {
      throw InputError(detail::concat("dataset '", options_.path, "': bad shape ",
                                      options_.channels, "x", options_.height, "x",
                                      options_.width));
    }
    if (options_.num_labels <= 0) {
      throw InputError(detail::concat("dataset '", options_.path,
                                      "': num_labels must be positive, got ", options_.num_labels));
    }
    db_ = openDb(options_.path, options_.type);
    keys_ = db_->keys();
    values_ = db_->values();
    TROUPE_ENFORCE(values_.empty() || values_.size() == keys_.size(), "database '", options_.path,
                   "' listed ", keys_.size(), " keys and ", values_.size(), " values");
  }

  std::int64_t size() const override { return static_cast<std::int64_t>(keys_.size()); }
  const DatasetOptions& options() const override { return options_; }

  void read(const std::vector<std::int64_t>& indices, float* images,
            std::int32_t* labels) override {
    const std::size_t image_size =
        static_cast<std::size_t>(options_.channels) * options_.height * options_.width;
    touch(indices);
    for (std::size_t i = 0; i < indices.size(); ++i) {
      const std::int64_t index = indices[i];
      if (index < 0 || index >= size()) [[unlikely]] {
        throw InputError(detail::concat("dataset '", options_.path, "': index ", index,
                                        " is out of range [0, ", size(), ")"));
      }
      const std::string& key = keys_[static_cast<std::size_t>(index)];
      const std::string_view bytes =
          values_.empty() ? db_->peek(key) : values_[static_cast<std::size_t>(index)];
      labels[i] = decoder_.decode(key, bytes, images + i * image_size);
    }
  }

 private:
  // Records come in a random order, each a miss in every cache, and decoding one waits on its
  // misses one after another. A load of every cache line of every record first, independent
  // loads that the CPU overlaps, halves the time of a batch (prefetch instructions did not).
  void touch(const std::vector<std::int64_t>& indices) const {
    if (values_.empty()) return;
    unsigned char sum = 0;
    for (const std::int64_t index : indices) {
      if (index < 0 || index >= size()) continue;  // read() reports it
      const std::string_view v = values_[static_cast<std::size_t>(index)];
      for (std::size_t offset = 0; offset < v.size(); offset += 64)
        sum ^= static_cast<unsigned char>(v[offset]);
    }
    touched_ ^= sum;  // keeps the loads
  }

  DatasetOptions options_;
  DatumDecoder decoder_;
  std::unique_ptr<DbReader> db_;
  std::vector<std::string> keys_;
  std::vector<std::string_view> values_;  // by position, where the database has such views
  mutable unsigned char touched_ = 0;
};

std::uint64_t mix64(std::uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}

}  // namespace

std::unique_ptr<Dataset> openDataset(const DatasetOptions& options) {
  if (isMemoryDataset(options.path)) return openMemoryDataset(options);
  return std::make_unique<DbDataset>(options);
}

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
