// A training or test set: a database of Caffe Datum records, read in batches by index.
//
// Records may hold raw pixels (uint8 in `data`, or `float_data`) or an encoded JPEG/PNG image.
// Every record is checked against the expected shape and label range; a record that does not fit
// or does not decode throws InputError naming the database and the record's key.
// Thread safety: one thread at a time (each reader actor opens its own Dataset).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "data/db.h"

namespace troupe::data {

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
};

class Dataset {
 public:
  virtual ~Dataset() = default;
  virtual std::int64_t size() const = 0;
  virtual const DatasetOptions& options() const = 0;
  // Decodes records at the given indices (0 <= index < size()) into images (indices.size() x C x
  // H x W floats, row-major) and labels.
  virtual void read(const std::vector<std::int64_t>& indices, float* images,
                    std::int32_t* labels) = 0;
};

std::unique_ptr<Dataset> openDataset(const DatasetOptions& options);

// The order of records in an epoch: a permutation of [0, size) that depends only on (seed, epoch),
// so every process computes the same one and a resumed run sees the same data.
std::vector<std::int64_t> epochOrder(std::int64_t size, std::uint64_t seed, std::int64_t epoch);

}  // namespace troupe::data
