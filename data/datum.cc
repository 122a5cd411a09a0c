#include "data/datum.h"

#include "troupe/error.h"

namespace troupe::data {

BadRecordError::BadRecordError(std::string database, std::string key, const std::string& why)
    : InputError(detail::concat("database '", database, "': record '", key, "' ", why)),
      database_(std::move(database)),
      key_(std::move(key)) {}

DatumDecoder::DatumDecoder(const DatasetOptions& options) : options_(options) {
  for (int v = 0; v < 256; ++v)
    lut_[v] = (static_cast<float>(v) - options_.mean) * options_.scale;
}

void DatumDecoder::bad(const std::string& key, const std::string& what) const {
  throw BadRecordError(options_.path, key, what);
}

std::int32_t DatumDecoder::decode(const std::string& key, std::string_view bytes, float* out) {
  if (!datum_.ParseFromArray(bytes.data(), static_cast<int>(bytes.size()))) [[unlikely]] {
    bad(key, detail::concat("is not a Datum (", bytes.size(),
                            " bytes that do not parse; corrupt or truncated)"));
  }
  const std::int32_t label = datum_.label();
  if (label < 0 || label >= options_.num_labels) [[unlikely]] {
    bad(key, detail::concat("has label ", label, ", expected 0 <= label < ", options_.num_labels));
  }
  if (datum_.encoded()) {
    decodeEncoded(key, out);
  } else {
    decodeRaw(key, out);
  }
  return label;
}

void DatumDecoder::checkShape(const std::string& key, int channels, int height, int width) const {
  if (channels != options_.channels || height != options_.height || width != options_.width)
      [[unlikely]] {
    bad(key, detail::concat("has shape ", channels, "x", height, "x", width, " (CxHxW), expected ",
                            options_.channels, "x", options_.height, "x", options_.width));
  }
}

void DatumDecoder::decodeRaw(const std::string& key, float* out) const {
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
    bad(key,
        detail::concat("holds ", data.size(), " pixel bytes, expected ", n, " (", options_.channels,
                       "x", options_.height, "x", options_.width, "); corrupt or truncated"));
  }
  const auto* in = reinterpret_cast<const std::uint8_t*>(data.data());
  for (std::size_t j = 0; j < n; ++j)
    out[j] = lut_[in[j]];
}

void DatumDecoder::decodeEncoded(const std::string& key, float* out) {
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
    float* dst = out + k * plane;
    for (std::size_t j = 0; j < plane; ++j)
      dst[j] = lut_[in[j * c + k]];
  }
}

}  // namespace troupe::data
