// Private to data/ (and its tests): JPEG/PNG decoding and encoding, and bilinear resizing, on
// 8-bit images stored interleaved (height x width x channels). Color images are in BGR order, as
// Caffe (through OpenCV) stores them; gray images have one channel.
//
// Errors: bytes that are not a JPEG or PNG image, or that do not decode, throw InputError; the
// caller adds which file or record they came from.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace troupe::data {

enum class ImageFormat { kUnknown, kJpeg, kPng };

// Judged by the first bytes (JPEG: FF D8 FF; PNG: 89 'PNG').
ImageFormat sniffImageFormat(std::string_view bytes);

struct Image {
  int height = 0;
  int width = 0;
  int channels = 0;                  // 1 (gray) or 3 (BGR)
  std::vector<std::uint8_t> pixels;  // height x width x channels
};

struct ImageInfo {
  int height = 0;
  int width = 0;
  int channels = 0;  // what the file holds: 1 for gray, 3 for color (alpha is not counted)
};

// Reads the header only.
ImageInfo probeImage(std::string_view bytes);

// Decodes into `out` (its buffer is reused) as `channels` channels: 1 converts color to gray
// (luma), 3 replicates gray, 0 keeps the file's own (gray or BGR). Alpha is dropped.
void decodeImage(std::string_view bytes, int channels, Image& out);

std::string encodePng(const Image& image);
// quality 1..100; 95 is OpenCV's default, which Caffe's convert_imageset uses.
std::string encodeJpeg(const Image& image, int quality = 95);

// Bilinear resize with pixel centers aligned (as OpenCV's INTER_LINEAR, without its fixed-point
// rounding).
Image resizeBilinear(const Image& image, int height, int width);

}  // namespace troupe::data
