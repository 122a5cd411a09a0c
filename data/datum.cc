#include "data/datum.h"

#include <algorithm>
#include <type_traits>

#include "troupe/error.h"

namespace troupe::data {
namespace {

// The fields of a raw Datum (pixels in `data`), read straight from the protobuf wire format: no
// copy of the pixels, no allocation. Anything else (float_data, a malformed or unexpected field)
// makes parse() answer false, and the record goes the way of the generated parser, which also
// says what is wrong with it.
struct RawDatum {
  std::int32_t channels = 0, height = 0, width = 0, label = 0;
  bool encoded = false;
  std::string_view data;

  bool parse(std::string_view bytes) {
    const auto* p = reinterpret_cast<const std::uint8_t*>(bytes.data());
    const auto* end = p + bytes.size();
    while (p < end) {
      std::uint64_t tag;
      if (!varint(p, end, tag)) return false;
      const std::uint64_t field = tag >> 3, wire = tag & 7;
      if (wire == 0) {  // varint
        std::uint64_t v;
        if (!varint(p, end, v)) return false;
        const auto i = static_cast<std::int32_t>(v);  // int32 fields: the low 32 bits
        switch (field) {
          case 1:
            channels = i;
            break;
          case 2:
            height = i;
            break;
          case 3:
            width = i;
            break;
          case 5:
            label = i;
            break;
          case 7:
            encoded = v != 0;
            break;
          default:
            return false;
        }
      } else if (wire == 2 && field == 4) {  // length-delimited: data
        std::uint64_t n;
        if (!varint(p, end, n) || n > static_cast<std::uint64_t>(end - p)) return false;
        data = std::string_view(reinterpret_cast<const char*>(p), static_cast<std::size_t>(n));
        p += n;
      } else {
        return false;
      }
    }
    return true;
  }

  static bool varint(const std::uint8_t*& p, const std::uint8_t* end, std::uint64_t& value) {
    value = 0;
    for (int shift = 0; shift < 64 && p < end; shift += 7) {
      const std::uint8_t byte = *p++;
      value |= static_cast<std::uint64_t>(byte & 0x7f) << shift;
      if (!(byte & 0x80)) return true;
    }
    return false;
  }
};

// out[j] = (in[j] - mean) * scale, vectorised for the CPU at hand.
__attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default"))) void toFloats(
    const std::uint8_t* __restrict in, float* __restrict out, std::size_t n, float mean,
    float scale) {
#pragma omp simd
  for (std::size_t j = 0; j < n; ++j)
    out[j] = (static_cast<float>(in[j]) - mean) * scale;
}

}  // namespace

Normalisation normalisationOf(const DatasetOptions& options) {
  Normalisation n{{options.mean}, {options.scale}};
  if (!options.mean_per_channel.empty()) n.mean = options.mean_per_channel;
  if (!options.std_per_channel.empty()) {
    n.scale.clear();
    for (const float std : options.std_per_channel)
      n.scale.push_back(1.0f / std);
  }
  return n;
}

BadRecordError::BadRecordError(std::string database, std::string key, const std::string& why)
    : InputError(detail::concat("database '", database, "': record '", key, "' ", why)),
      database_(std::move(database)),
      key_(std::move(key)) {}

DatumDecoder::DatumDecoder(const DatasetOptions& options) : options_(options) {
  for (int v = 0; v < 256; ++v)
    lut_[v] = (static_cast<float>(v) - options_.mean) * options_.scale;
  if (options_.transforms()) {
    auto [mean, scale] = normalisationOf(options_);
    try {
      transform_ =
          std::make_unique<ImageTransform>(options_.transform, options_.train, options_.channels,
                                           options_.height, options_.width, mean, scale);
    } catch (const InputError& e) {
      throw InputError(detail::concat("dataset '", options_.path, "': ", e.what()));
    }
  }
}

void DatumDecoder::bad(const std::string& key, const std::string& what) const {
  throw BadRecordError(options_.path, key, what);
}

std::int32_t DatumDecoder::decode(const std::string& key, std::string_view bytes, SplitMix64& rng,
                                  float* out) {
  return decodeTo(key, bytes, rng, out);
}

std::int32_t DatumDecoder::decode(const std::string& key, std::string_view bytes, SplitMix64& rng,
                                  std::uint8_t* out) {
  return decodeTo(key, bytes, rng, out);
}

void DatumDecoder::pixels(const std::uint8_t* in, std::size_t n, float* out) const {
  toFloats(in, out, n, options_.mean, options_.scale);
}

void DatumDecoder::pixels(const std::uint8_t* in, std::size_t n, std::uint8_t* out) const {
  std::copy_n(in, n, out);
}

template <typename T>
std::int32_t DatumDecoder::decodeTo(const std::string& key, std::string_view bytes, SplitMix64& rng,
                                    T* out) {
  if (RawDatum raw; raw.parse(bytes) && !raw.encoded) {
    checkLabel(key, raw.label);
    if (transform_) {
      transformRaw(key, raw.data, raw.channels, raw.height, raw.width, rng, out);
      return raw.label;
    }
    checkShape(key, raw.channels, raw.height, raw.width);
    checkPixels(key, raw.data.size());
    pixels(reinterpret_cast<const std::uint8_t*>(raw.data.data()), raw.data.size(), out);
    return raw.label;
  }
  if (!datum_.ParseFromArray(bytes.data(), static_cast<int>(bytes.size()))) [[unlikely]] {
    bad(key, detail::concat("is not a Datum (", bytes.size(),
                            " bytes that do not parse; corrupt or truncated)"));
  }
  const std::int32_t label = datum_.label();
  checkLabel(key, label);
  if (transform_ && datum_.encoded()) {
    try {
      transform_->encoded(datum_.data(), rng, out);
    } catch (const InputError& e) {
      // "is 1x1, smaller than the crop ..." as it is; a decoder's error after "does not decode".
      const std::string_view what = e.what();
      bad(key, what.starts_with("is ") || what.starts_with("has ")
                   ? std::string(what)
                   : detail::concat("does not decode: ", what));
    }
  } else if (transform_) {
    if (datum_.float_data_size() > 0) {
      bad(key, "holds float_data, which troupe does not crop or resize (store uint8 pixels)");
    }
    transformRaw(key, datum_.data(), datum_.channels(), datum_.height(), datum_.width(), rng, out);
  } else if (datum_.encoded()) {
    decodeEncoded(key, out);
  } else {
    decodeRaw(key, out);
  }
  return label;
}

template <typename T>
void DatumDecoder::transformRaw(const std::string& key, std::string_view bytes, int channels,
                                int height, int width, SplitMix64& rng, T* out) {
  if (channels <= 0 || height <= 0 || width <= 0 ||
      static_cast<unsigned __int128>(bytes.size()) !=
          static_cast<unsigned __int128>(channels) * height * width) {
    bad(key, detail::concat("holds ", bytes.size(), " pixel bytes for its shape ", channels, "x",
                            height, "x", width, "; corrupt or truncated"));
  }
  try {
    transform_->raw(reinterpret_cast<const std::uint8_t*>(bytes.data()), channels, height, width,
                    rng, out);
  } catch (const InputError& e) {
    bad(key, e.what());
  }
}

void DatumDecoder::checkShape(const std::string& key, int channels, int height, int width) const {
  if (channels != options_.channels || height != options_.height || width != options_.width)
      [[unlikely]] {
    bad(key, detail::concat("has shape ", channels, "x", height, "x", width, " (CxHxW), expected ",
                            options_.channels, "x", options_.height, "x", options_.width));
  }
}

void DatumDecoder::checkLabel(const std::string& key, std::int32_t label) const {
  if (label < 0 || label >= options_.num_labels) [[unlikely]] {
    bad(key, detail::concat("has label ", label, ", expected 0 <= label < ", options_.num_labels));
  }
}

void DatumDecoder::checkPixels(const std::string& key, std::size_t bytes) const {
  const std::size_t n =
      static_cast<std::size_t>(options_.channels) * options_.height * options_.width;
  if (bytes != n) [[unlikely]] {
    bad(key, detail::concat("holds ", bytes, " pixel bytes, expected ", n, " (", options_.channels,
                            "x", options_.height, "x", options_.width, "); corrupt or truncated"));
  }
}

template <typename T>
void DatumDecoder::decodeRaw(const std::string& key, T* out) const {
  checkShape(key, datum_.channels(), datum_.height(), datum_.width());
  const std::size_t n =
      static_cast<std::size_t>(options_.channels) * options_.height * options_.width;
  if (datum_.float_data_size() > 0) {
    if constexpr (std::is_same_v<T, std::uint8_t>) {
      bad(key, "holds float_data, which has no uint8 form (input_dtype uint8 needs uint8 pixels)");
    } else {
      if (static_cast<std::size_t>(datum_.float_data_size()) != n) [[unlikely]] {
        bad(key, detail::concat("holds ", datum_.float_data_size(), " floats, expected ", n));
      }
      const float* in = datum_.float_data().data();
      for (std::size_t j = 0; j < n; ++j)
        out[j] = (in[j] - options_.mean) * options_.scale;
      return;
    }
  }
  const std::string& data = datum_.data();
  checkPixels(key, data.size());
  pixels(reinterpret_cast<const std::uint8_t*>(data.data()), n, out);
}

template <typename T>
void DatumDecoder::decodeEncoded(const std::string& key, T* out) {
  if (options_.channels != 1 && options_.channels != 3) {
    bad(key, detail::concat("is an encoded image, which decodes to 1 or 3 channels, not ",
                            options_.channels));
  }
  ImageInfo info;
  try {
    info = probeImage(datum_.data());
  } catch (const InputError& e) {
    bad(key, detail::concat("does not decode: ", e.what()));
  }
  // The header's size first: a corrupt one claiming a huge image must not be decoded into memory.
  checkShape(key, options_.channels, info.height, info.width);
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
    T* dst = out + k * plane;
    for (std::size_t j = 0; j < plane; ++j) {
      if constexpr (std::is_same_v<T, float>) {
        dst[j] = lut_[in[j * c + k]];
      } else {
        dst[j] = in[j * c + k];
      }
    }
  }
}

}  // namespace troupe::data
