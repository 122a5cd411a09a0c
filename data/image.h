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

// The most pixels (height x width) an image may declare: 100 million pixels are 300 MB decoded,
// beyond any photograph data set (ImageNet's largest is about 35 million); a header claiming more
// is corrupt or hostile (a few hundred bytes of PNG or JPEG may claim 65535 x 65535).
inline constexpr std::int64_t kMaxImagePixels = 100'000'000;

// Throws InputError ("is a WxH image, over the limit of N pixels") when height x width exceeds
// max_pixels: checked from the header, before anything of the image is allocated.
void checkImagePixels(std::int64_t height, std::int64_t width,
                      std::int64_t max_pixels = kMaxImagePixels);

// Columns [x, x + width) and rows [y, y + height) of an image.
struct Rect {
  int x = 0;
  int y = 0;
  int width = 0;
  int height = 0;
};

// Part of a JPEG decoded at 1/denominator of its size.
struct ImageRegion {
  Image image;                          // the pixels decoded
  int x = 0;                            // where image's first column and row lie in the whole
  int y = 0;                            //   scaled image
  int full_height = 0, full_width = 0;  // the whole scaled image's size
};

// The side of a JPEG's image decoded at 1/denominator: ceil(side / denominator), as libjpeg scales.
int scaledJpegSide(int side, int denominator);

// Decodes only the rows and columns of `region` (in the pixels of the image scaled by
// 1/denominator, 1, 2, 4 or 8: libjpeg's DCT-domain scaling, which skips most of the inverse DCT's
// work; clipped to the image) as `channels` channels (1, 3, or 0 for the file's own). Rows above
// the region are entropy-decoded only, rows below it not at all. out covers the region and a
// margin of a few pixels (wider where libjpeg crops at an iMCU boundary): out.x and out.y say
// where it starts. The region's pixels are those of the whole image decoded; the margin's
// outermost may not be (libjpeg upsamples chroma at the edge of what it decodes from the edge). The
// libjpeg API of libjpeg-turbo, since the TurboJPEG API of its 2.1 release (Debian 12's) crops
// nothing. Throws InputError for bytes that are not a JPEG, a CMYK/YCCK JPEG, data that end before
// the region does (truncated) or do not decode, a denominator or channel count outside those
// above, and a header declaring more than max_pixels (checkImagePixels) before any decoding.
void decodeJpegRegion(std::string_view bytes, int denominator, Rect region, int channels,
                      ImageRegion& out, std::int64_t max_pixels = kMaxImagePixels);

// Decodes into `out` (its buffer is reused) as `channels` channels: 1 converts color to gray
// (luma), 3 replicates gray, 0 keeps the file's own (gray or BGR). Alpha is dropped; 16-bit PNGs
// are reduced to 8 bits. JPEGs decode as decodeJpegRegion's whole image, with its errors; an image
// declaring more than max_pixels is refused from its header.
void decodeImage(std::string_view bytes, int channels, Image& out,
                 std::int64_t max_pixels = kMaxImagePixels);

std::string encodePng(const Image& image);
// quality 1..100; 95 is OpenCV's default, which Caffe's convert_imageset uses.
std::string encodeJpeg(const Image& image, int quality = 95);

// Bilinear resize with pixel centers aligned (as OpenCV's INTER_LINEAR, without its fixed-point
// rounding).
Image resizeBilinear(const Image& image, int height, int width);

}  // namespace troupe::data
