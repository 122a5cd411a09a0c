// Building databases of Caffe Datum records: from Fashion-MNIST's IDX files and from image lists
// (what Caffe's convert_mnist_data and convert_imageset do).
#pragma once

#include <cstdint>
#include <string>

#include "data/db.h"

namespace troupe::data {

struct ConvertStats {
  std::int64_t train = 0;
  std::int64_t test = 0;
};

// Reads train-images-idx3-ubyte(.gz) etc. from source_dir and writes out_dir/train and
// out_dir/test. encoded: store PNG-encoded images instead of raw pixels.
ConvertStats convertFashionMnist(const std::string& source_dir, const std::string& out_dir,
                                 DbType type, bool encoded);

struct ImagesetOptions {
  DbType type = DbType::kLmdb;
  bool shuffle = false;
  std::uint64_t seed = 1;
  int resize_height = 0;  // 0: keep
  int resize_width = 0;
  bool gray = false;
  // Store the files' encoded bytes (as convert_imageset --encoded) instead of decoded pixels;
  // encode_type "jpg"/"png" re-encodes, empty keeps the file's own format.
  bool encoded = false;
  std::string encode_type;
};

// list_file holds lines "relative/path.jpg LABEL"; images are read from root/relative/path.jpg.
// Returns the number of records written.
std::int64_t convertImageset(const std::string& list_file, const std::string& root,
                             const std::string& out_db, const ImagesetOptions& options);

}  // namespace troupe::data
