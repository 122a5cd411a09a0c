// libFuzzer target: the bytes of an image file as `troupe convert images` and the readers decode
// it (data/image.h): its header probed, then the image decoded under a limit of pixels
// (checkImagePixels, before anything of it is allocated), whole and as a region at every DCT scale.
// Bad input may only throw troupe::InputError. A finding: a crash, another exception, a sanitizer
// report, an allocation past the run's limit (-malloc_limit_mb: a header claiming 65535 x 65535
// that were decoded), or a decoded image over the limit or of another size than its header said.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string_view>

#include "data/image.h"
#include "troupe/error.h"

namespace {

constexpr std::int64_t kMaxPixels = 1 << 20;  // 4 MB of BGR a decode at most

[[noreturn]] void finding(const char* what) {
  std::fprintf(stderr, "image_header_fuzz: %s\n", what);
  std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  namespace d = troupe::data;
  const std::string_view bytes(reinterpret_cast<const char*>(data), size);
  d::ImageInfo info;
  try {
    info = d::probeImage(bytes);
  } catch (const troupe::InputError&) {
    return 0;
  }
  if (info.height <= 0 || info.width <= 0) finding("a header probed to no size");
  for (const int channels : {0, 1, 3}) {
    d::Image image;
    try {
      d::decodeImage(bytes, channels, image, kMaxPixels);
    } catch (const troupe::InputError&) {
      continue;
    }
    if (static_cast<std::int64_t>(image.height) * image.width > kMaxPixels)
      finding("an image over the limit was decoded");
    if (image.height != info.height || image.width != info.width)
      finding("a decoded image of another size than its header");
    if (image.pixels.size() != static_cast<std::size_t>(image.height) * image.width *
                                   static_cast<std::size_t>(image.channels))
      finding("pixels of another size than the image");
  }
  if (d::sniffImageFormat(bytes) != d::ImageFormat::kJpeg) return 0;
  for (const int denominator : {1, 2, 4, 8}) {
    d::ImageRegion region;
    try {
      d::decodeJpegRegion(bytes, denominator, d::Rect{1, 1, 5, 5}, 3, region, kMaxPixels);
    } catch (const troupe::InputError&) {
      continue;
    }
    if (region.full_width != d::scaledJpegSide(info.width, denominator) ||
        region.full_height != d::scaledJpegSide(info.height, denominator))
      finding("a region's image of another size than its header scaled");
  }
  return 0;
}
