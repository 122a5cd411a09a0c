// libFuzzer target: the bytes of one database record, decoded as Dataset::read decodes them (a
// Caffe Datum of raw pixels, float_data, or an encoded JPEG/PNG image), once for Fashion-MNIST's
// shape (1x28x28, 10 labels) and once for color images of that size; then through the image
// transforms, where records of any size are cropped: a training one (random-resized crop with
// region decoding at a DCT scale, mirror, colour jitter, per-channel mean and std) and a test one
// (resize of the short side, centre crop; zero-padded crops of raw pixels). Bad input may only
// throw troupe::Error; anything else (a crash, another exception, a sanitizer report) is a finding.
//
// Half of the mutations keep the input a Datum and mutate its `data` field (the pixels or the
// encoded image), which byte-level mutations of the whole record would mostly leave unparseable.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

#include "data/datum.h"
#include "troupe/error.h"

extern "C" std::size_t LLVMFuzzerMutate(std::uint8_t* data, std::size_t size, std::size_t max_size);

namespace {

troupe::data::DatasetOptions fashionMnist(int channels) {
  troupe::data::DatasetOptions options;
  options.path = "fuzz";
  options.channels = channels;
  options.height = 28;
  options.width = 28;
  options.num_labels = 10;
  return options;
}

troupe::data::DatasetOptions transformed(bool train) {
  auto options = fashionMnist(3);
  options.height = options.width = 24;
  options.train = train;
  options.transform.crop = 24;
  if (train) {
    options.transform.random_resized_crop = true;
    options.transform.mirror = true;
    options.transform.brightness = options.transform.contrast = options.transform.saturation = 0.4f;
    options.mean_per_channel = {104, 117, 123};
    options.std_per_channel = {57, 57, 58};
  } else {
    options.transform.resize_short = 27;
    options.transform.pad = 4;
  }
  return options;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static troupe::data::DatumDecoder gray(fashionMnist(1));
  static troupe::data::DatumDecoder color(fashionMnist(3));
  static troupe::data::DatumDecoder train(transformed(true));
  static troupe::data::DatumDecoder test(transformed(false));
  static std::vector<float> out(3 * 28 * 28);
  static std::vector<std::uint8_t> out_bytes(3 * 28 * 28);  // input_dtype uint8
  const std::string_view bytes(reinterpret_cast<const char*>(data), size);
  for (auto* decoder : {&gray, &color, &train, &test}) {
    for (const bool as_bytes : {false, true}) {
      try {
        troupe::data::SplitMix64 rng(size);
        if (as_bytes) {
          decoder->decode("00000000", bytes, rng, out_bytes.data());
        } else {
          decoder->decode("00000000", bytes, rng, out.data());
        }
      } catch (const troupe::Error&) {
        // The record is refused, naming the database and the key.
      }
    }
  }
  return 0;
}

extern "C" std::size_t LLVMFuzzerCustomMutator(std::uint8_t* data, std::size_t size,
                                               std::size_t max_size, unsigned int seed) {
  caffe::Datum datum;
  if (seed % 2 == 0 || !datum.ParseFromArray(data, static_cast<int>(size))) {
    return LLVMFuzzerMutate(data, size, max_size);
  }
  std::string field = datum.data();
  const std::size_t used = field.size();
  field.resize(std::max(max_size, used));
  field.resize(LLVMFuzzerMutate(reinterpret_cast<std::uint8_t*>(field.data()), used, field.size()));
  datum.set_data(field);
  const std::string record = datum.SerializeAsString();
  if (record.size() > max_size) return LLVMFuzzerMutate(data, size, max_size);
  std::memcpy(data, record.data(), record.size());
  return record.size();
}
