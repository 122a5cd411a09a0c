// A training or test set: a database of Caffe Datum records, read in batches by index.
//
// Records may hold raw pixels (uint8 in `data`, or `float_data`) or an encoded JPEG/PNG image.
// Every record is checked against the expected shape and label range; a record that does not fit
// or does not decode throws BadRecordError (an InputError) naming the database and the record's
// key, so that a caller may skip the record and go on.
// Thread safety: one thread at a time (each reader actor opens its own Dataset).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "data/db.h"
#include "data/image_transform.h"
#include "troupe/error.h"

namespace troupe::data {

// One record of a database is bad: it does not parse, decode or fit the expected shape or labels.
// what() is "database 'PATH': record 'KEY' WHY".
class BadRecordError : public InputError {
 public:
  BadRecordError(std::string database, std::string key, const std::string& why);
  const std::string& database() const { return database_; }
  const std::string& key() const { return key_; }

 private:
  std::string database_;
  std::string key_;
};

struct DatasetOptions {
  std::string path;
  DbType type = DbType::kLmdb;
  int channels = 1;
  int height = 28;
  int width = 28;
  int num_labels = 10;
  // pixel value -> (value - mean) * scale
  float mean = 0.0f;
  float scale = 1.0f / 255.0f;
  // Caffe2's: pixel value -> (value - mean_per_channel[c]) / std_per_channel[c], replacing mean
  // and scale (one list without the other keeps the other's single value), in the order of the
  // stored channels (BGR in databases of Caffe and troupe).
  std::vector<float> mean_per_channel;
  std::vector<float> std_per_channel;
  // Crops, resizing, mirror and jitter (data/image_transform.h). Records of any size are read when
  // transform.crop > 0: it is the height and width above, which must equal it.
  ImageTransformOptions transform;
  bool train = false;      // random crops, mirror and jitter (else centre crops)
  std::uint64_t seed = 1;  // with the epoch and the record's index, seeds its draws
  // Records decoded at once by this many threads (MXNet's preprocess_threads).
  int decode_threads = 1;
  // The training reader asks for uint8 images, the values before mean and scale, which the
  // replica normalises on its device (TrainOptions::input_dtype "uint8"): a quarter of the bytes.
  bool uint8 = false;

  // Above 0: the records are sequences of this many tokens from token shards (data/
  // token_dataset.h), each token's label the one after it, every token below num_labels (the
  // vocabulary); the image settings do not apply.
  std::int64_t sequence_length = 0;

  // Values a sample holds (an image's, or a sequence's tokens), and labels (one, or one a token).
  std::int64_t sampleSize() const {
    return sequence_length > 0 ? sequence_length : std::int64_t{channels} * height * width;
  }
  std::int64_t labelsPerSample() const { return sequence_length > 0 ? sequence_length : 1; }

  // Whether records go through an ImageTransform: a transform, or per-channel normalisation.
  bool transforms() const {
    return transform.active() || !mean_per_channel.empty() || !std_per_channel.empty();
  }
};

class Dataset {
 public:
  virtual ~Dataset() = default;
  virtual std::int64_t size() const = 0;
  virtual const DatasetOptions& options() const = 0;
  // Decodes records at the given indices (0 <= index < size(), in database key order) into images
  // (indices.size() x C x H x W floats, row-major) and labels. Raw records must have exactly the
  // options' shape; encoded (JPEG/PNG) records must have its height and width, and are decoded to
  // its channels (gray and color convert into each other, as Caffe's forced decoding does). Color
  // channels are in the order stored (BGR for databases written by Caffe or troupe). Throws
  // BadRecordError for the first record that does not parse, does not decode, has another shape
  // or a label outside [0, num_labels); InputError for an index out of range. images and labels
  // are partly written when it throws. A transform draws each record's crop from (seed, epoch,
  // index): the same in every run, whichever process or thread reads it.
  virtual void read(const std::vector<std::int64_t>& indices, std::int64_t epoch, float* images,
                    std::int32_t* labels) = 0;
  // The same as uint8 values before the mean and scale (crops, mirror and jitter applied). A record
  // of float_data is a BadRecordError; a dataset without uint8 images (memory://) an InputError.
  virtual void read(const std::vector<std::int64_t>& indices, std::int64_t epoch,
                    std::uint8_t* images, std::int32_t* labels);
  // A token dataset's sequences (DatasetOptions::sequence_length t): tokens and labels, each
  // indices.size() x t. An image dataset throws InputError.
  virtual void read(const std::vector<std::int64_t>& indices, std::int64_t epoch,
                    std::int32_t* tokens, std::int32_t* labels);
};

// What a value of channel c becomes: (value - mean[c]) * scale[c], one element standing for every
// channel: mean_per_channel and 1 / std_per_channel where given, else mean and scale. The images
// read(..., std::uint8_t*) gives become read(..., float*)'s through Backend::normalise with them.
struct Normalisation {
  std::vector<float> mean, scale;
};
Normalisation normalisationOf(const DatasetOptions& options);

// Opens the database and loads its key list; throws as openDb() does, and InputError for a
// non-positive shape or num_labels. A path "memory://NAME" opens a dataset this process holds in
// memory (data/memory_dataset.h); with sequence_length, the path is token shards
// (data/token_dataset.h).
std::unique_ptr<Dataset> openDataset(const DatasetOptions& options);

// The PRNG behind epochOrder and shuffled conversions, fixed here so that orders are the same on
// every platform and standard library: splitmix64 (Steele, Lea, Flood 2014).
class SplitMix64 {
 public:
  explicit SplitMix64(std::uint64_t seed) : state_(seed) {}
  std::uint64_t next();
  // Uniform in [0, bound), bound > 0, by Lemire's multiply-shift with rejection (unbiased).
  std::uint64_t below(std::uint64_t bound);

 private:
  std::uint64_t state_;
};

// The generator of one record's transform in an epoch: splitmix64 seeded by mixing the three.
SplitMix64 recordRandom(std::uint64_t seed, std::int64_t epoch, std::int64_t index);

// Fisher-Yates from the back: for i = n-1 down to 1, swap values[i] with values[rng.below(i+1)].
void shuffle(std::vector<std::int64_t>& values, SplitMix64& rng);

// The order of records in an epoch: a permutation of [0, size) that depends only on (seed, epoch),
// so every process computes the same one and a resumed run sees the same data. Specified as:
// shuffle(iota(size), SplitMix64(mix(mix(seed) + epoch))), mix being splitmix64's finalizer.
std::vector<std::int64_t> epochOrder(std::int64_t size, std::uint64_t seed, std::int64_t epoch);

}  // namespace troupe::data
