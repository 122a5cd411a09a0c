#include "data/dataset.h"
#include "data/token_dataset.h"

#include "data/datum.h"
#include "data/memory_dataset.h"
#include "data/thread_team.h"
#include "troupe/error.h"

namespace troupe::data {
namespace {

class DbDataset final : public Dataset {
 public:
  explicit DbDataset(const DatasetOptions& options) : options_(options) {
    if (options_.channels <= 0 || options_.height <= 0 || options_.width <= 0) {
      throw InputError(detail::concat("dataset '", options_.path, "': bad shape ",
                                      options_.channels, "x", options_.height, "x",
                                      options_.width));
    }
    if (options_.decode_threads < 1) {
      throw InputError(detail::concat("dataset '", options_.path,
                                      "': decode_threads must be at least 1, got ",
                                      options_.decode_threads));
    }
    for (int t = 0; t < options_.decode_threads; ++t)
      decoders_.emplace_back(options_);
    if (options_.decode_threads > 1) team_ = std::make_unique<ThreadTeam>(options_.decode_threads);
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

  void read(const std::vector<std::int64_t>& indices, std::int64_t epoch, float* images,
            std::int32_t* labels) override {
    readInto(indices, epoch, images, labels);
  }

  void read(const std::vector<std::int64_t>& indices, std::int64_t epoch, std::uint8_t* images,
            std::int32_t* labels) override {
    readInto(indices, epoch, images, labels);
  }

 private:
  template <typename T>
  void readInto(const std::vector<std::int64_t>& indices, std::int64_t epoch, T* images,
                std::int32_t* labels) {
    const std::size_t image_size =
        static_cast<std::size_t>(options_.channels) * options_.height * options_.width;
    for (const std::int64_t index : indices) {
      if (index < 0 || index >= size()) [[unlikely]] {
        throw InputError(detail::concat("dataset '", options_.path, "': index ", index,
                                        " is out of range [0, ", size(), ")"));
      }
    }
    touch(indices);
    // Records that are no views (LevelDB's) are copied out first: the reader has one buffer.
    if (values_.empty() && team_) {
      copies_.resize(indices.size());
      for (std::size_t i = 0; i < indices.size(); ++i)
        copies_[i] = db_->get(keys_[static_cast<std::size_t>(indices[i])]);
    }
    auto decode = [&](std::int64_t slot, int member) {
      const auto i = static_cast<std::size_t>(slot);
      const auto index = static_cast<std::size_t>(indices[i]);
      const std::string& key = keys_[index];
      const std::string_view bytes = !values_.empty() ? values_[index]
                                     : team_          ? copies_[i]
                                                      : db_->peek(key);
      SplitMix64 rng = recordRandom(options_.seed, epoch, indices[i]);
      labels[i] = decoders_[static_cast<std::size_t>(member)].decode(key, bytes, rng,
                                                                     images + i * image_size);
    };
    if (team_ && indices.size() > 1) {
      team_->run(static_cast<std::int64_t>(indices.size()), decode);
    } else {
      for (std::size_t i = 0; i < indices.size(); ++i)
        decode(static_cast<std::int64_t>(i), 0);
    }
  }

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
  std::vector<DatumDecoder> decoders_;  // one per thread of the team
  std::unique_ptr<ThreadTeam> team_;    // decode_threads > 1
  std::vector<std::string> copies_;
  std::unique_ptr<DbReader> db_;
  std::vector<std::string> keys_;
  std::vector<std::string_view> values_;  // by position, where the database has such views
  mutable unsigned char touched_ = 0;
};

}  // namespace

void Dataset::read(const std::vector<std::int64_t>&, std::int64_t, std::uint8_t*, std::int32_t*) {
  throw InputError(detail::concat("dataset '", options().path,
                                  "' holds float images: input_dtype uint8 needs a database"));
}

void Dataset::read(const std::vector<std::int64_t>&, std::int64_t, std::int32_t*, std::int32_t*) {
  throw InputError(detail::concat("dataset '", options().path,
                                  "' holds images: a language model (block_size) reads token "
                                  "shards"));
}

std::unique_ptr<Dataset> openDataset(const DatasetOptions& options) {
  if (options.sequence_length > 0) return openTokenDataset(options);
  if (isMemoryDataset(options.path)) return openMemoryDataset(options);
  return std::make_unique<DbDataset>(options);
}

}  // namespace troupe::data
