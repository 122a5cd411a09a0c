#include "data/image.h"

#include <png.h>
#include <turbojpeg.h>

#include <algorithm>
#include <cmath>
#include <csetjmp>
#include <cstdio>
#include <cstring>
#include <memory>

// jpeglib.h needs FILE and size_t declared first.
#include <jerror.h>
#include <jpeglib.h>

#include "troupe/error.h"

namespace troupe::data {
namespace {

struct TjDeleter {
  void operator()(void* handle) const { tjDestroy(handle); }
};
using TjHandle = std::unique_ptr<void, TjDeleter>;

// One decompressor and one compressor per thread, created on first use.
TjHandle& decompressorHandle() {
  thread_local TjHandle handle;
  return handle;
}
tjhandle decompressor() {
  TjHandle& handle = decompressorHandle();
  if (!handle) handle.reset(tjInitDecompress());
  if (!handle)
    throw IoError(detail::concat("cannot start a JPEG decoder: ", tjGetErrorStr2(nullptr)));
  return handle.get();
}

tjhandle compressor() {
  thread_local TjHandle handle(tjInitCompress());
  if (!handle)
    throw IoError(detail::concat("cannot start a JPEG encoder: ", tjGetErrorStr2(nullptr)));
  return handle.get();
}

const unsigned char* bytesOf(std::string_view bytes) {
  return reinterpret_cast<const unsigned char*>(bytes.data());
}

void checkChannels(int channels) {
  if (channels != 0 && channels != 1 && channels != 3) {
    throw InputError(
        detail::concat("cannot decode an image to ", channels, " channels (only 1 or 3)"));
  }
}

const char* jpegHeaderError(std::string_view bytes);

ImageInfo probeJpeg(std::string_view bytes) {
  tjhandle tj = decompressor();
  int width = 0, height = 0, subsamp = 0, colorspace = 0;
  const bool read = tjDecompressHeader3(tj, bytesOf(bytes), bytes.size(), &width, &height, &subsamp,
                                        &colorspace) == 0;
  // A stream of tables only (no frame) passes TurboJPEG's header read with no size at all.
  if (!read || width <= 0 || height <= 0) {
    // TurboJPEG keeps the text of a libjpeg error in one string for the whole process, which
    // decode threads failing at once overwrite: the header is read again by this thread's own
    // libjpeg decoder for its message (TurboJPEG's own refusals have their handle's).
    const char* why = jpegHeaderError(bytes);
    const std::string message = detail::concat("bad JPEG header: ", why    ? why
                                                                    : read ? "no image in it"
                                                                           : tjGetErrorStr2(tj));
    // TurboJPEG's header read returns from a libjpeg error without aborting: its decompressor
    // stays mid-header, and this thread's next JPEG would be read as the rest of that header
    // ("Bogus DQT index 15" of a good image). A new one, then.
    if (!read) decompressorHandle().reset();
    throw InputError(message);
  }
  return {height, width, colorspace == TJCS_GRAY ? 1 : 3};
}

// libjpeg reports errors by calling error_exit, which must not return: it jumps back to the
// setjmp of decodeRegion, past libjpeg's own C frames only. Warnings are kept but for one: data
// that end early (a truncated file), which libjpeg would fill with gray.
struct JpegErrors {
  jpeg_error_mgr mgr;
  std::jmp_buf jump;
  char message[JMSG_LENGTH_MAX];
  bool truncated;
};

void onJpegError(j_common_ptr cinfo) {
  auto* errors = reinterpret_cast<JpegErrors*>(cinfo->err);
  (*cinfo->err->format_message)(cinfo, errors->message);
  std::longjmp(errors->jump, 1);
}

void onJpegMessage(j_common_ptr cinfo, int level) {
  auto* errors = reinterpret_cast<JpegErrors*>(cinfo->err);
  if (level < 0 && cinfo->err->msg_code == JWRN_JPEG_EOF) errors->truncated = true;
}

// One decompressor per thread, reused (jpeg_abort_decompress after each image).
struct JpegDecoder {
  jpeg_decompress_struct cinfo;
  JpegErrors errors;
  JpegDecoder() {
    cinfo.err = jpeg_std_error(&errors.mgr);
    errors.mgr.error_exit = onJpegError;
    errors.mgr.emit_message = onJpegMessage;
    jpeg_create_decompress(&cinfo);
  }
  ~JpegDecoder() { jpeg_destroy_decompress(&cinfo); }
  JpegDecoder(const JpegDecoder&) = delete;
  JpegDecoder& operator=(const JpegDecoder&) = delete;
};

// What libjpeg says of the header, or nullptr if it reads it.
const char* jpegHeaderError(std::string_view bytes) {
  thread_local JpegDecoder d;
  jpeg_decompress_struct* cinfo = &d.cinfo;
  if (setjmp(d.errors.jump)) {
    jpeg_abort_decompress(cinfo);
    return d.errors.message;
  }
  jpeg_mem_src(cinfo, reinterpret_cast<const unsigned char*>(bytes.data()),
               static_cast<unsigned long>(bytes.size()));
  jpeg_read_header(cinfo, TRUE);
  jpeg_abort_decompress(cinfo);
  return nullptr;
}

constexpr int kRegionMargin = 2;

struct RegionJob {
  std::string_view bytes;
  int denominator;
  Rect region;
  int channels;
  ImageRegion* out;
  std::int64_t max_pixels;
  std::vector<JSAMPROW> rows;
  std::int64_t declared_height = 0, declared_width = 0;  // set when over max_pixels
};

// decodeRegion's answer for a header over its job's max_pixels (the caller says by how much).
constexpr const char kOverLimit[] = "over the limit of pixels";

// Returns nullptr, or what went wrong. C++ objects that this frame changes after setjmp are
// reached through `job` (memory, not registers), as a longjmp back here requires.
const char* decodeRegion(JpegDecoder& d, RegionJob& job) {
  jpeg_decompress_struct* cinfo = &d.cinfo;
  d.errors.truncated = false;
  if (setjmp(d.errors.jump)) {
    jpeg_abort_decompress(cinfo);
    return d.errors.message;  // "JPEG does not decode: " goes before it
  }
  jpeg_mem_src(cinfo, reinterpret_cast<const unsigned char*>(job.bytes.data()),
               static_cast<unsigned long>(job.bytes.size()));
  jpeg_read_header(cinfo, TRUE);
  // Before jpeg_start_decompress, which allocates for the whole image.
  if (static_cast<std::int64_t>(cinfo->image_width) * cinfo->image_height > job.max_pixels) {
    job.declared_height = cinfo->image_height;
    job.declared_width = cinfo->image_width;
    jpeg_abort_decompress(cinfo);
    return kOverLimit;
  }
  if (cinfo->jpeg_color_space == JCS_CMYK || cinfo->jpeg_color_space == JCS_YCCK) {
    jpeg_abort_decompress(cinfo);
    return "a CMYK JPEG, which troupe does not decode (convert it to RGB first)";
  }
  const bool gray_file = cinfo->jpeg_color_space == JCS_GRAYSCALE;
  const int channels = job.channels == 0 ? (gray_file ? 1 : 3) : job.channels;
  cinfo->out_color_space = channels == 1 ? JCS_GRAYSCALE : JCS_EXT_BGR;
  cinfo->scale_num = 1;
  cinfo->scale_denom = static_cast<unsigned>(job.denominator);
  jpeg_start_decompress(cinfo);
  ImageRegion& out = *job.out;
  out.full_width = static_cast<int>(cinfo->output_width);
  out.full_height = static_cast<int>(cinfo->output_height);
  // A margin of kRegionMargin pixels around the region: libjpeg upsamples the chroma at the edge
  // of what it decodes from that edge alone, so the outermost decoded pixels may differ from the
  // whole image's; those inside the margin do not.
  const Rect& r = job.region;
  const int x0 = std::clamp(r.x - kRegionMargin, 0, out.full_width - 1);
  const int y0 = std::clamp(r.y - kRegionMargin, 0, out.full_height - 1);
  const int x1 = std::clamp(r.x + r.width + kRegionMargin, x0 + 1, out.full_width);
  const int y1 = std::clamp(r.y + r.height + kRegionMargin, y0 + 1, out.full_height);
  auto xoffset = static_cast<JDIMENSION>(x0);
  auto width = static_cast<JDIMENSION>(x1 - x0);
  if (width < cinfo->output_width) jpeg_crop_scanline(cinfo, &xoffset, &width);
  out.x = static_cast<int>(xoffset);
  out.y = y0;
  out.image.width = static_cast<int>(width);
  out.image.height = y1 - y0;
  out.image.channels = channels;
  const std::size_t stride = static_cast<std::size_t>(width) * channels;
  out.image.pixels.resize(stride * out.image.height);
  if (y0 > 0) jpeg_skip_scanlines(cinfo, static_cast<JDIMENSION>(y0));
  job.rows.resize(static_cast<std::size_t>(out.image.height));
  for (int r = 0; r < out.image.height; ++r)
    job.rows[static_cast<std::size_t>(r)] = out.image.pixels.data() + stride * r;
  while (cinfo->output_scanline < static_cast<JDIMENSION>(y1)) {
    const auto done = static_cast<std::size_t>(cinfo->output_scanline) - y0;
    jpeg_read_scanlines(cinfo, job.rows.data() + done,
                        static_cast<JDIMENSION>(y1) - cinfo->output_scanline);
  }
  jpeg_abort_decompress(cinfo);
  return d.errors.truncated ? "a truncated JPEG (its data end before the image does)" : nullptr;
}

void decodeJpeg(std::string_view bytes, int channels, Image& out, std::int64_t max_pixels) {
  const ImageInfo info = probeJpeg(bytes);
  ImageRegion region;
  region.image = std::move(out);
  decodeJpegRegion(bytes, 1, Rect{0, 0, info.width, info.height}, channels, region, max_pixels);
  out = std::move(region.image);
}

struct PngImage {
  png_image image;
  PngImage() {
    std::memset(&image, 0, sizeof image);
    image.version = PNG_IMAGE_VERSION;
  }
  ~PngImage() { png_image_free(&image); }
};

ImageInfo probePng(std::string_view bytes, PngImage& png) {
  if (!png_image_begin_read_from_memory(&png.image, bytes.data(), bytes.size())) {
    throw InputError(detail::concat("bad PNG header: ", png.image.message));
  }
  return {static_cast<int>(png.image.height), static_cast<int>(png.image.width),
          (png.image.format & PNG_FORMAT_FLAG_COLOR) ? 3 : 1};
}

void convertChannels(const std::vector<std::uint8_t>& in, int in_channels, Image& out) {
  const std::size_t n = static_cast<std::size_t>(out.height) * out.width;
  out.pixels.resize(n * out.channels);
  if (in_channels == 1) {  // gray -> BGR
    for (std::size_t i = 0; i < n; ++i) {
      out.pixels[3 * i] = out.pixels[3 * i + 1] = out.pixels[3 * i + 2] = in[i];
    }
  } else {  // BGR -> gray, OpenCV's fixed-point luma
    for (std::size_t i = 0; i < n; ++i) {
      const unsigned b = in[3 * i], g = in[3 * i + 1], r = in[3 * i + 2];
      out.pixels[i] = static_cast<std::uint8_t>((r * 4899 + g * 9617 + b * 1868 + 8192) >> 14);
    }
  }
}

void decodePng(std::string_view bytes, int channels, Image& out, std::int64_t max_pixels) {
  PngImage png;
  const ImageInfo info = probePng(bytes, png);
  checkImagePixels(info.height, info.width, max_pixels);
  if (channels == 0) channels = info.channels;
  png.image.format = info.channels == 1 ? PNG_FORMAT_GRAY : PNG_FORMAT_BGR;
  out.height = info.height;
  out.width = info.width;
  out.channels = channels;
  const std::size_t native_size =
      static_cast<std::size_t>(info.height) * info.width * info.channels;
  std::vector<std::uint8_t> native;
  std::vector<std::uint8_t>& target = channels == info.channels ? out.pixels : native;
  target.resize(native_size);
  if (!png_image_finish_read(&png.image, nullptr, target.data(), 0, nullptr)) {
    throw InputError(detail::concat("PNG does not decode: ", png.image.message));
  }
  if (channels != info.channels) convertChannels(native, info.channels, out);
}

void checkImage(const Image& image) {
  if ((image.channels != 1 && image.channels != 3) || image.height <= 0 || image.width <= 0 ||
      image.pixels.size() !=
          static_cast<std::size_t>(image.height) * image.width * image.channels) {
    throw InvariantError(detail::concat("malformed image ", image.height, "x", image.width, "x",
                                        image.channels, " with ", image.pixels.size(), " bytes"));
  }
}

}  // namespace

ImageFormat sniffImageFormat(std::string_view bytes) {
  static constexpr unsigned char kJpeg[] = {0xFF, 0xD8, 0xFF};
  static constexpr unsigned char kPng[] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1A, '\n'};
  if (bytes.size() >= sizeof kJpeg && std::memcmp(bytes.data(), kJpeg, sizeof kJpeg) == 0) {
    return ImageFormat::kJpeg;
  }
  if (bytes.size() >= sizeof kPng && std::memcmp(bytes.data(), kPng, sizeof kPng) == 0) {
    return ImageFormat::kPng;
  }
  return ImageFormat::kUnknown;
}

ImageInfo probeImage(std::string_view bytes) {
  switch (sniffImageFormat(bytes)) {
    case ImageFormat::kJpeg:
      return probeJpeg(bytes);
    case ImageFormat::kPng: {
      PngImage png;
      return probePng(bytes, png);
    }
    default:
      throw InputError("not a JPEG or PNG image");
  }
}

void checkImagePixels(std::int64_t height, std::int64_t width, std::int64_t max_pixels) {
  if (height * width > max_pixels) {
    throw InputError(detail::concat("is a ", width, "x", height, " image, over the limit of ",
                                    max_pixels, " pixels"));
  }
}

int scaledJpegSide(int side, int denominator) {
  return (side + denominator - 1) / denominator;
}

void decodeJpegRegion(std::string_view bytes, int denominator, Rect region, int channels,
                      ImageRegion& out, std::int64_t max_pixels) {
  checkChannels(channels);
  if (denominator != 1 && denominator != 2 && denominator != 4 && denominator != 8) {
    throw InputError(detail::concat("cannot decode a JPEG at 1/", denominator,
                                    " of its size (only 1, 2, 4 or 8)"));
  }
  if (sniffImageFormat(bytes) != ImageFormat::kJpeg) throw InputError("not a JPEG image");
  thread_local JpegDecoder decoder;
  RegionJob job{bytes, denominator, region, channels, &out, max_pixels, {}};
  if (const char* error = decodeRegion(decoder, job)) {
    if (error == kOverLimit) checkImagePixels(job.declared_height, job.declared_width, max_pixels);
    if (error == decoder.errors.message) {
      throw InputError(detail::concat("JPEG does not decode: ", error));
    }
    throw InputError(error);
  }
}

void decodeImage(std::string_view bytes, int channels, Image& out, std::int64_t max_pixels) {
  checkChannels(channels);
  switch (sniffImageFormat(bytes)) {
    case ImageFormat::kJpeg:
      return decodeJpeg(bytes, channels, out, max_pixels);
    case ImageFormat::kPng:
      return decodePng(bytes, channels, out, max_pixels);
    default:
      throw InputError("not a JPEG or PNG image");
  }
}

std::string encodePng(const Image& image) {
  checkImage(image);
  PngImage png;
  png.image.width = static_cast<png_uint_32>(image.width);
  png.image.height = static_cast<png_uint_32>(image.height);
  png.image.format = image.channels == 1 ? PNG_FORMAT_GRAY : PNG_FORMAT_BGR;
  std::string out(PNG_IMAGE_PNG_SIZE_MAX(png.image), '\0');
  png_alloc_size_t size = out.size();
  if (!png_image_write_to_memory(&png.image, out.data(), &size, 0, image.pixels.data(), 0,
                                 nullptr)) {
    throw InputError(detail::concat("cannot encode PNG: ", png.image.message));
  }
  out.resize(size);
  return out;
}

std::string encodeJpeg(const Image& image, int quality) {
  checkImage(image);
  tjhandle tj = compressor();
  unsigned char* buffer = nullptr;
  unsigned long size = 0;
  const bool gray = image.channels == 1;
  if (tjCompress2(tj, image.pixels.data(), image.width, 0, image.height,
                  gray ? TJPF_GRAY : TJPF_BGR, &buffer, &size, gray ? TJSAMP_GRAY : TJSAMP_420,
                  quality, TJFLAG_ACCURATEDCT) != 0) {
    tjFree(buffer);
    throw InputError(detail::concat("cannot encode JPEG: ", tjGetErrorStr2(tj)));
  }
  std::string out(reinterpret_cast<const char*>(buffer), size);
  tjFree(buffer);
  return out;
}

Image resizeBilinear(const Image& image, int height, int width) {
  checkImage(image);
  if (height <= 0 || width <= 0) {
    throw InputError(detail::concat("cannot resize to ", height, "x", width));
  }
  Image out;
  out.height = height;
  out.width = width;
  out.channels = image.channels;
  out.pixels.resize(static_cast<std::size_t>(height) * width * image.channels);
  const int c = image.channels;
  const double sy = static_cast<double>(image.height) / height;
  const double sx = static_cast<double>(image.width) / width;
  // Source column pairs and weights, computed once per output column.
  std::vector<int> x0(width), x1(width);
  std::vector<float> fx(width);
  for (int x = 0; x < width; ++x) {
    const double src = std::clamp((x + 0.5) * sx - 0.5, 0.0, image.width - 1.0);
    x0[x] = static_cast<int>(src);
    x1[x] = std::min(x0[x] + 1, image.width - 1);
    fx[x] = static_cast<float>(src - x0[x]);
  }
  for (int y = 0; y < height; ++y) {
    const double src = std::clamp((y + 0.5) * sy - 0.5, 0.0, image.height - 1.0);
    const int y0 = static_cast<int>(src);
    const int y1 = std::min(y0 + 1, image.height - 1);
    const float fy = static_cast<float>(src - y0);
    const std::uint8_t* row0 = image.pixels.data() + static_cast<std::size_t>(y0) * image.width * c;
    const std::uint8_t* row1 = image.pixels.data() + static_cast<std::size_t>(y1) * image.width * c;
    std::uint8_t* dst = out.pixels.data() + static_cast<std::size_t>(y) * width * c;
    for (int x = 0; x < width; ++x) {
      for (int k = 0; k < c; ++k) {
        const float top = row0[x0[x] * c + k] + fx[x] * (row0[x1[x] * c + k] - row0[x0[x] * c + k]);
        const float bottom =
            row1[x0[x] * c + k] + fx[x] * (row1[x1[x] * c + k] - row1[x0[x] * c + k]);
        const float v = top + fy * (bottom - top);
        dst[x * c + k] = static_cast<std::uint8_t>(std::clamp(v + 0.5f, 0.0f, 255.0f));
      }
    }
  }
  return out;
}

}  // namespace troupe::data
