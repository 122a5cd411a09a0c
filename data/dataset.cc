#include "data/dataset.h"

#include <array>

#include "data/datum.h"
#include "data/image.h"
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
    if (options_.num_labels <= 0) {
      throw InputError(detail::concat("dataset '", options_.path,
                                      "': num_labels must be positive, got ", options_.num_labels));
    }
    db_ = openDb(options_.path, options_.type);
    keys_ = db_->keys();
    for (int v = 0; v < 256; ++v)
      lut_[v] = (static_cast<float>(v) - options_.mean) * options_.scale;
  }

  std::int64_t size() const override { return static_cast<std::int64_t>(keys_.size()); }
  const DatasetOptions& options() const override { return options_; }

  void read(const std::vector<std::int64_t>& indices, float* images,
            std::int32_t* labels) override {
    const std::size_t image_size =
        static_cast<std::size_t>(options_.channels) * options_.height * options_.width;
    for (std::size_t i = 0; i < indices.size(); ++i) {
      const std::int64_t index = indices[i];
      if (index < 0 || index >= size()) [[unlikely]] {
        throw InputError(detail::concat("dataset '", options_.path, "': index ", index,
                                        " is out of range [0, ", size(), ")"));
      }
      labels[i] = decode(keys_[static_cast<std::size_t>(index)], images + i * image_size);
    }
  }

 private:
  [[noreturn]] void bad(const std::string& key, const std::string& what) const {
    throw BadRecordError(options_.path, key, what);
  }

  std::int32_t decode(const std::string& key, float* out) {
    const std::string_view bytes = db_->peek(key);
    if (!datum_.ParseFromArray(bytes.data(), static_cast<int>(bytes.size()))) [[unlikely]] {
      bad(key, detail::concat("is not a Datum (", bytes.size(),
                              " bytes that do not parse; corrupt or truncated)"));
    }
    const std::int32_t label = datum_.label();
    if (label < 0 || label >= options_.num_labels) [[unlikely]] {
      bad(key,
          detail::concat("has label ", label, ", expected 0 <= label < ", options_.num_labels));
    }
    if (datum_.encoded()) {
      decodeEncoded(key, out);
    } else {
      decodeRaw(key, out);
    }
    return label;
  }

  void checkShape(const std::string& key, int channels, int height, int width) const {
    if (channels != options_.channels || height != options_.height || width != options_.width)
        [[unlikely]] {
      bad(key,
          detail::concat("has shape ", channels, "x", height, "x", width, " (CxHxW), expected ",
                         options_.channels, "x", options_.height, "x", options_.width));
    }
  }

  void decodeRaw(const std::string& key, float* out) const {
    checkShape(key, datum_.channels(), datum_.height(), datum_.width());
    const std::size_t n =
        static_cast<std::size_t>(options_.channels) * options_.height * options_.width;
    if (datum_.float_data_size() > 0) {
      if (static_cast<std::size_t>(datum_.float_data_size()) != n) [[unlikely]] {
        bad(key, detail::concat("holds ", datum_.float_data_size(), " floats, expected ", n));
      }
      const float* in = datum_.float_data().data();
      for (std::size_t j = 0; j < n; ++j)
        out[j] = (in[j] - options_.mean) * options_.scale;
      return;
    }
    const std::string& data = datum_.data();
    if (data.size() != n) [[unlikely]] {
      bad(key, detail::concat("holds ", data.size(), " pixel bytes, expected ", n, " (",
                              options_.channels, "x", options_.height, "x", options_.width,
                              "); corrupt or truncated"));
    }
    const auto* in = reinterpret_cast<const std::uint8_t*>(data.data());
    for (std::size_t j = 0; j < n; ++j)
      out[j] = lut_[in[j]];
  }

  void decodeEncoded(const std::string& key, float* out) {
    if (options_.channels != 1 && options_.channels != 3) {
      bad(key, detail::concat("is an encoded image, which decodes to 1 or 3 channels, not ",
                              options_.channels));
    }
    try {
      // Gray and color convert into each other, as Caffe forces color or gray on decoding.
      decodeImage(datum_.data(), options_.channels, image_);
    } catch (const InputError& e) {
      bad(key, detail::concat("does not decode: ", e.what()));
    }
    checkShape(key, image_.channels, image_.height, image_.width);
    const int c = image_.channels;
    const std::size_t plane = static_cast<std::size_t>(image_.height) * image_.width;
    const std::uint8_t* in = image_.pixels.data();
    for (int k = 0; k < c; ++k) {  // HxWxC -> CxHxW
      float* dst = out + k * plane;
      for (std::size_t j = 0; j < plane; ++j)
        dst[j] = lut_[in[j * c + k]];
    }
  }

  DatasetOptions options_;
  std::unique_ptr<DbReader> db_;
  std::vector<std::string> keys_;
  std::array<float, 256> lut_{};
  caffe::Datum datum_;
  Image image_;
};

std::uint64_t mix64(std::uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}

}  // namespace

BadRecordError::BadRecordError(std::string database, std::string key, const std::string& why)
    : InputError(detail::concat("database '", database, "': record '", key, "' ", why)),
      database_(std::move(database)),
      key_(std::move(key)) {}

std::unique_ptr<Dataset> openDataset(const DatasetOptions& options) {
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
