// Fashion-MNIST from the IDX files of Debian's dataset-fashion-mnist, in memory: what the
// examples train on. Header-only, for the examples alone (zlib).
#pragma once

#include <zlib.h>

#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

namespace examples {

// Where Debian's dataset-fashion-mnist puts the IDX files.
constexpr const char* kFashionMnist = "/usr/share/datasets/fashion-mnist";
constexpr int kPixels = 28 * 28;
constexpr int kClasses = 10;

struct FashionMnist {
  std::vector<float> images;  // size() x 784, scaled to [0, 1]
  std::vector<int> labels;
  int size() const { return static_cast<int>(labels.size()); }
};

namespace detail {

// The whole of a gzip'ed file.
inline std::vector<unsigned char> gunzip(const std::string& path) {
  gzFile f = gzopen(path.c_str(), "rb");
  if (!f) throw std::runtime_error("cannot open " + path);
  std::vector<unsigned char> out;
  unsigned char buf[1 << 16];
  int n = 0;
  while ((n = gzread(f, buf, sizeof buf)) > 0)
    out.insert(out.end(), buf, buf + n);
  gzclose(f);
  if (n < 0) throw std::runtime_error("cannot read " + path);
  return out;
}

inline std::uint32_t bigEndian(const std::vector<unsigned char>& b, std::size_t at) {
  return (std::uint32_t{b[at]} << 24) | (std::uint32_t{b[at + 1]} << 16) |
         (std::uint32_t{b[at + 2]} << 8) | b[at + 3];
}

}  // namespace detail

// `prefix` "train" or "t10k" in `dir`; std::runtime_error naming the file when it is missing or
// not IDX.
inline FashionMnist loadFashionMnist(const std::string& dir, const std::string& prefix) {
  using detail::bigEndian;
  const auto images = detail::gunzip(dir + "/" + prefix + "-images-idx3-ubyte.gz");
  const auto labels = detail::gunzip(dir + "/" + prefix + "-labels-idx1-ubyte.gz");
  if (images.size() < 16 || bigEndian(images, 0) != 2051 || labels.size() < 8 ||
      bigEndian(labels, 0) != 2049) {
    throw std::runtime_error("not Fashion-MNIST IDX files in " + dir);
  }
  const std::uint32_t n = bigEndian(images, 4);
  if (bigEndian(labels, 4) != n || images.size() != 16 + std::size_t{n} * kPixels ||
      labels.size() != 8 + std::size_t{n}) {
    throw std::runtime_error("truncated IDX files in " + dir);
  }
  FashionMnist s;
  s.images.resize(std::size_t{n} * kPixels);
  for (std::size_t i = 0; i < s.images.size(); ++i)
    s.images[i] = images[16 + i] / 255.0f;
  s.labels.assign(labels.begin() + 8, labels.end());
  return s;
}

}  // namespace examples
