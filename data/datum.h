// Private to data/ (and its tests): the generated caffe::Datum class, and the decoding of Datum
// records into a dataset's images and labels. protobuf_generate_cpp writes datum.pb.h at the top of
// the build folder; a generator that keeps the source layout writes data/datum.pb.h. Either is
// found.
#pragma once

#if __has_include("data/datum.pb.h")
#include "data/datum.pb.h"
#else
#include "datum.pb.h"
#endif

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "data/dataset.h"
#include "data/image.h"
#include "data/image_transform.h"

namespace troupe::data {

// Decodes Datum records (raw pixels, float_data, or an encoded JPEG/PNG image) as Dataset::read
// does, against options' shape, label range, mean and scale. One thread at a time.
class DatumDecoder {
 public:
  // options' shape and num_labels are positive (openDataset checks them).
  explicit DatumDecoder(const DatasetOptions& options);

  // Decodes the record `bytes`, stored under `key`, into out (C x H x W floats) and returns its
  // label; options.transform draws from rng. Throws BadRecordError naming the database
  // (options.path) and the key for a record that does not parse, does not decode, has another
  // shape (or, transformed, is too small for the crop) or a label outside [0, num_labels); out is
  // partly written then.
  std::int32_t decode(const std::string& key, std::string_view bytes, SplitMix64& rng, float* out);
  // The same as uint8 values before the mean and scale (DatasetOptions::uint8); a record of
  // float_data has no such form and is a BadRecordError.
  std::int32_t decode(const std::string& key, std::string_view bytes, SplitMix64& rng,
                      std::uint8_t* out);

 private:
  template <typename T>
  std::int32_t decodeTo(const std::string& key, std::string_view bytes, SplitMix64& rng, T* out);
  [[noreturn]] void bad(const std::string& key, const std::string& what) const;
  void checkLabel(const std::string& key, std::int32_t label) const;
  void checkShape(const std::string& key, int channels, int height, int width) const;
  void checkPixels(const std::string& key, std::size_t bytes) const;
  template <typename T>
  void decodeRaw(const std::string& key, T* out) const;
  template <typename T>
  void decodeEncoded(const std::string& key, T* out);
  template <typename T>
  void transformRaw(const std::string& key, std::string_view pixels, int channels, int height,
                    int width, SplitMix64& rng, T* out);
  // Pixels to out: (value - mean) * scale as floats, or the values themselves as uint8.
  void pixels(const std::uint8_t* in, std::size_t n, float* out) const;
  void pixels(const std::uint8_t* in, std::size_t n, std::uint8_t* out) const;

  DatasetOptions options_;
  std::array<float, 256> lut_{};
  caffe::Datum datum_;
  Image image_;
  std::unique_ptr<ImageTransform>
      transform_;  // when the options transform or normalise per channel
};

}  // namespace troupe::data
