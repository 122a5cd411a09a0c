#include "data/image_transform.h"

#include <algorithm>
#include <cmath>

#include "data/dataset.h"
#include "troupe/error.h"

namespace troupe::data {
namespace {

// Uniform in [lo, hi), from the top 53 bits of one draw.
double uniform(SplitMix64& rng, double lo, double hi) {
  return lo + (hi - lo) * static_cast<double>(rng.next() >> 11) * 0x1.0p-53;
}

// Uniform integer in [lo, hi].
int between(SplitMix64& rng, int lo, int hi) {
  return lo + static_cast<int>(rng.below(static_cast<std::uint64_t>(hi - lo) + 1));
}

std::vector<float> perChannel(const std::vector<float>& values, int channels, const char* what) {
  if (values.size() == 1) return std::vector<float>(static_cast<std::size_t>(channels), values[0]);
  if (values.size() != static_cast<std::size_t>(channels)) {
    throw InputError(detail::concat(what, " has ", values.size(), " values for images of ",
                                    channels, " channels (give one, or one per channel)"));
  }
  return values;
}

template <typename T>
T store(float v);
template <>
float store<float>(float v) {
  return v;
}
template <>
std::uint8_t store<std::uint8_t>(float v) {
  return static_cast<std::uint8_t>(std::clamp(v + 0.5f, 0.0f, 255.0f));
}

}  // namespace

ImageTransform::ImageTransform(const ImageTransformOptions& options, bool train, int out_channels,
                               int out_height, int out_width, std::vector<float> mean,
                               std::vector<float> scale)
    : options_(options),
      train_(train),
      channels_(out_channels),
      height_(out_height),
      width_(out_width) {
  if (channels_ != 1 && channels_ != 3) {
    throw InputError(detail::concat("images are transformed to 1 or 3 channels, not ", channels_));
  }
  if (options_.crop > 0 && (height_ != options_.crop || width_ != options_.crop)) {
    throw InputError(detail::concat("crop ", options_.crop, " makes ", options_.crop, "x",
                                    options_.crop, " images, not ", height_, "x", width_));
  }
  if ((options_.resize_short > 0 || options_.random_resized_crop) && options_.crop <= 0) {
    throw InputError("resize_short and random_resized_crop need crop, the size of the output");
  }
  if (!(options_.min_area > 0 && options_.min_area <= options_.max_area &&
        options_.max_area <= 1)) {
    throw InputError(detail::concat("random_resized_crop's area [", options_.min_area, ", ",
                                    options_.max_area, "] is not within (0, 1]"));
  }
  if (!(options_.min_aspect > 0 && options_.min_aspect <= options_.max_aspect &&
        std::isfinite(options_.max_aspect))) {
    throw InputError(detail::concat("random_resized_crop's aspect ratio [", options_.min_aspect,
                                    ", ", options_.max_aspect, "] is not a positive range"));
  }
  mean_ = perChannel(mean, channels_, "mean_per_channel");
  scale_ = perChannel(scale, channels_, "std_per_channel");
}

ImageTransform::Window ImageTransform::window(int height, int width, SplitMix64& rng) const {
  Window w;
  const int crop = options_.crop;
  if (train_ && options_.random_resized_crop) {
    // The Inception recipe as torchvision draws it: ten tries at an area and a log-uniform aspect
    // ratio that fit, else the whole image cut to the nearest allowed aspect ratio.
    const double area = static_cast<double>(height) * width;
    const double log_lo = std::log(options_.min_aspect), log_hi = std::log(options_.max_aspect);
    for (int attempt = 0; attempt < 10; ++attempt) {
      const double target = area * uniform(rng, options_.min_area, options_.max_area);
      const double aspect = std::exp(uniform(rng, log_lo, log_hi));
      const int w_px = static_cast<int>(std::lround(std::sqrt(target * aspect)));
      const int h_px = static_cast<int>(std::lround(std::sqrt(target / aspect)));
      if (w_px > 0 && w_px <= width && h_px > 0 && h_px <= height) {
        w.y = between(rng, 0, height - h_px);
        w.x = between(rng, 0, width - w_px);
        w.width = w_px;
        w.height = h_px;
        break;
      }
    }
    if (w.width == 0) {
      const double ratio = static_cast<double>(width) / height;
      double w_px = width, h_px = height;
      if (ratio < options_.min_aspect) {
        h_px = std::round(w_px / options_.min_aspect);
      } else if (ratio > options_.max_aspect) {
        w_px = std::round(h_px * options_.max_aspect);
      }
      w.width = std::max(1.0, w_px);
      w.height = std::max(1.0, h_px);
      w.x = std::floor((width - w.width) / 2);
      w.y = std::floor((height - w.height) / 2);
    }
  } else if (crop > 0) {
    int short_side = options_.resize_short;
    if (short_side == 0 && options_.random_resized_crop) {
      short_side = static_cast<int>(std::lround(crop / 0.875));
    }
    // The crop in the resized image (as if it were resized whole), mapped back to this one.
    double sx = 1, sy = 1;
    int rw = width, rh = height;
    if (short_side > 0) {
      const ImageSize resized = shortSideResized(height, width, short_side);
      rw = resized.width;
      rh = resized.height;
      sx = static_cast<double>(rw) / width;
      sy = static_cast<double>(rh) / height;
    }
    const int pad = train_ ? options_.pad : 0;
    if (crop > rw + 2 * pad || crop > rh + 2 * pad) {
      throw InputError(detail::concat(
          "is ", width, "x", height, short_side > 0 ? ", resized to " : "",
          short_side > 0 ? std::to_string(rw) + "x" + std::to_string(rh) : std::string(),
          ", smaller than the crop ", crop, "x", crop));
    }
    const int cx = train_ ? between(rng, -pad, rw - crop + pad) : (rw - crop) / 2;
    const int cy = train_ ? between(rng, -pad, rh - crop + pad) : (rh - crop) / 2;
    w.x = cx / sx;
    w.y = cy / sy;
    w.width = crop / sx;
    w.height = crop / sy;
  } else {
    w.width = width;
    w.height = height;
  }
  if (train_) {
    if (options_.mirror) w.mirror = rng.next() >> 63;
    auto factor = [&](float j) {
      return j > 0 ? static_cast<float>(uniform(rng, std::max(0.0f, 1 - j), 1 + j)) : 1.0f;
    };
    w.brightness = factor(options_.brightness);
    w.contrast = factor(options_.contrast);
    w.saturation = factor(options_.saturation);
  }
  return w;
}

void ImageTransform::encoded(std::string_view bytes, SplitMix64& rng, float* out) {
  encodedTo(bytes, rng, out);
}

void ImageTransform::encoded(std::string_view bytes, SplitMix64& rng, std::uint8_t* out) {
  encodedTo(bytes, rng, out);
}

template <typename T>
void ImageTransform::encodedTo(std::string_view bytes, SplitMix64& rng, T* out) {
  const ImageInfo info = probeImage(bytes);
  if (options_.crop == 0 && (info.height != height_ || info.width != width_)) {
    throw InputError(detail::concat("has size ", info.height, "x", info.width, ", expected ",
                                    height_, "x", width_, " (set crop for images of any size)"));
  }
  const Window w = window(info.height, info.width, rng);
  const int pad = train_ ? options_.pad : 0;
  if (sniffImageFormat(bytes) == ImageFormat::kJpeg && pad == 0) {
    // The largest DCT scaling that keeps the crop at least as large as the output.
    int d = 8;
    while (d > 1 && (w.width / d < width_ || w.height / d < height_))
      d /= 2;
    const int full_h = scaledJpegSide(info.height, d), full_w = scaledJpegSide(info.width, d);
    planTaps(w, d, full_h, full_w);
    // Only the rows and columns the filter reads.
    const Rect want{across_.first.front(), down_.first.front(),
                    across_.first.back() + across_.count.back() - across_.first.front(),
                    down_.first.back() + down_.count.back() - down_.first.front()};
    decodeJpegRegion(bytes, d, want, channels_, region_);  // refuses a header over the limit
    TROUPE_ENFORCE(region_.full_width == full_w && region_.full_height == full_h,
                   "libjpeg scaled a ", info.width, "x", info.height, " JPEG by 1/", d, " to ",
                   region_.full_width, "x", region_.full_height, ", not ", full_w, "x", full_h);
    shiftTaps(across_, region_.x);
    shiftTaps(down_, region_.y);
    resample(region_.image, w, out);
    return;
  }
  decodeImage(bytes, channels_, image_);  // refuses a header over the limit
  pad > 0 ? fromPadded(w, out) : fromWhole(w, out);
}

template <typename T>
void ImageTransform::fromWhole(const Window& w, T* out) {
  planTaps(w, 1, image_.height, image_.width);
  resample(image_, w, out);
}

// The image in a frame of `pad` zeros, read through the window moved into the frame's pixels.
template <typename T>
void ImageTransform::fromPadded(Window w, T* out) {
  const int pad = options_.pad;
  padded_.height = image_.height + 2 * pad;
  padded_.width = image_.width + 2 * pad;
  padded_.channels = image_.channels;
  padded_.pixels.assign(static_cast<std::size_t>(padded_.height) * padded_.width * padded_.channels,
                        0);
  const std::size_t row = static_cast<std::size_t>(image_.width) * image_.channels;
  for (int y = 0; y < image_.height; ++y) {
    std::copy_n(image_.pixels.data() + row * y, row,
                padded_.pixels.data() +
                    (static_cast<std::size_t>(y + pad) * padded_.width + pad) * padded_.channels);
  }
  w.x += pad;
  w.y += pad;
  planTaps(w, 1, padded_.height, padded_.width);
  resample(padded_, w, out);
}

void ImageTransform::raw(const std::uint8_t* chw, int channels, int height, int width,
                         SplitMix64& rng, float* out) {
  rawTo(chw, channels, height, width, rng, out);
}

void ImageTransform::raw(const std::uint8_t* chw, int channels, int height, int width,
                         SplitMix64& rng, std::uint8_t* out) {
  rawTo(chw, channels, height, width, rng, out);
}

template <typename T>
void ImageTransform::rawTo(const std::uint8_t* chw, int channels, int height, int width,
                           SplitMix64& rng, T* out) {
  if (channels != channels_) {
    throw InputError(detail::concat("has ", channels, " channels, expected ", channels_));
  }
  if (options_.crop == 0 && (height != height_ || width != width_)) {
    throw InputError(detail::concat("has size ", height, "x", width, ", expected ", height_, "x",
                                    width_, " (set crop for images of any size)"));
  }
  checkImagePixels(height, width);
  const Window w = window(height, width, rng);
  image_.height = height;
  image_.width = width;
  image_.channels = channels;
  image_.pixels.resize(static_cast<std::size_t>(height) * width * channels);
  const std::size_t plane = static_cast<std::size_t>(height) * width;
  for (int c = 0; c < channels; ++c) {
    for (std::size_t i = 0; i < plane; ++i)
      image_.pixels[i * channels + c] = chw[c * plane + i];
  }
  train_&& options_.pad > 0 ? fromPadded(w, out) : fromWhole(w, out);
}

namespace {

// The triangle filter's taps along one axis: output pixel j of n covers [start, start + length)
// of a line of `size` source pixels (edges at integers, pixel k's centre at k + 0.5). The filter's
// radius is the downscale factor, at least 1 (bilinear when upscaling); taps outside the line are
// dropped and the rest renormalised, as Pillow does.
template <typename Taps>
void taps(Taps& t, double start, double length, int n, int size) {
  const double f = length / n;
  const double r = std::max(1.0, f);
  t.stride = static_cast<int>(std::ceil(2 * r)) + 1;
  t.first.resize(static_cast<std::size_t>(n));
  t.count.resize(static_cast<std::size_t>(n));
  t.weights.assign(static_cast<std::size_t>(n) * t.stride, 0.0f);
  for (int j = 0; j < n; ++j) {
    const double centre = start + (j + 0.5) * f - 0.5;
    int lo = std::max(0, static_cast<int>(std::floor(centre - r)) + 1);
    int hi = std::min(size - 1, static_cast<int>(std::ceil(centre + r)) - 1);
    if (lo > hi) lo = hi = std::clamp(static_cast<int>(std::lround(centre)), 0, size - 1);
    float* w = t.weights.data() + static_cast<std::size_t>(j) * t.stride;
    double sum = 0;
    for (int k = lo; k <= hi; ++k) {
      const double v = std::max(0.0, 1 - std::abs(k - centre) / r);
      w[k - lo] = static_cast<float>(v);
      sum += v;
    }
    if (sum <= 0) {  // only at an edge, past the last centre
      w[0] = 1;
      hi = lo;
      sum = 1;
    }
    for (int k = lo; k <= hi; ++k)
      w[k - lo] = static_cast<float>(w[k - lo] / sum);
    t.first[static_cast<std::size_t>(j)] = lo;
    t.count[static_cast<std::size_t>(j)] = hi - lo + 1;
  }
}

}  // namespace

void ImageTransform::planTaps(const Window& window, int scale_down, int full_height,
                              int full_width) {
  taps(across_, window.x / scale_down, window.width / scale_down, width_, full_width);
  taps(down_, window.y / scale_down, window.height / scale_down, height_, full_height);
}

void ImageTransform::shiftTaps(Taps& t, int origin) {
  for (int& first : t.first)
    first -= origin;
}

ImageTransform::Reach ImageTransform::reach() const {
  return {down_.first.front(), down_.first.back() + down_.count.back(), across_.first.front(),
          across_.first.back() + across_.count.back()};
}

// The reach's pixels as floats in source_, `lanes` to a pixel: a row of the reach after another.
void ImageTransform::sourceToFloats(const Image& source, const Reach& area, int lanes) {
  const int c = channels_;
  const std::size_t cols = static_cast<std::size_t>(area.col_hi - area.col_lo) * lanes;
  source_.resize(static_cast<std::size_t>(area.row_hi - area.row_lo) * cols);
  for (int y = area.row_lo; y < area.row_hi; ++y) {
    const std::uint8_t* src =
        source.pixels.data() + (static_cast<std::size_t>(y) * source.width + area.col_lo) * c;
    float* dst = source_.data() + static_cast<std::size_t>(y - area.row_lo) * cols;
    if (lanes == 4) {
      // Converted where they lie (a loop the compiler makes SIMD), then spread into lanes.
      const auto n = static_cast<std::size_t>(area.col_hi - area.col_lo);
      float* packed = dst + n;  // the row's last quarter, overwritten last
#pragma omp simd
      for (std::size_t x = 0; x < 3 * n; ++x)
        packed[x] = src[x];
      for (std::size_t x = 0; x < n; ++x) {
        const float b = packed[3 * x], g = packed[3 * x + 1], r = packed[3 * x + 2];
        dst[4 * x] = b;
        dst[4 * x + 1] = g;
        dst[4 * x + 2] = r;
        dst[4 * x + 3] = 0.0f;
      }
    } else {
#pragma omp simd
      for (std::size_t x = 0; x < cols; ++x)
        dst[x] = src[x];
    }
  }
}

// The horizontal pass over the reach's rows, from source_ into rows_ (a row of width_ pixels each).
void ImageTransform::horizontalPass(const Reach& area, int lanes) {
  const std::size_t cols = static_cast<std::size_t>(area.col_hi - area.col_lo) * lanes;
  const std::size_t row_len = static_cast<std::size_t>(width_) * lanes;
  rows_.resize(static_cast<std::size_t>(area.row_hi - area.row_lo) * row_len);
  for (int y = area.row_lo; y < area.row_hi; ++y) {
    const float* src = source_.data() + static_cast<std::size_t>(y - area.row_lo) * cols;
    float* dst = rows_.data() + static_cast<std::size_t>(y - area.row_lo) * row_len;
    for (int j = 0; j < width_; ++j) {
      const float* s = src + static_cast<std::size_t>(across_.first[j] - area.col_lo) * lanes;
      const float* w = across_.weights.data() + static_cast<std::size_t>(j) * across_.stride;
      const int n = across_.count[j];
      if (lanes == 4) {
        float acc[4] = {0, 0, 0, 0};
        for (int k = 0; k < n; ++k) {
#pragma omp simd
          for (int l = 0; l < 4; ++l)
            acc[l] += w[k] * s[4 * k + l];
        }
#pragma omp simd
        for (int l = 0; l < 4; ++l)
          dst[4 * j + l] = acc[l];
      } else {
        float v = 0;
        for (int k = 0; k < n; ++k)
          v += w[k] * s[k];
        dst[j] = v;
      }
    }
  }
}

// The vertical pass for output row i, from rows_ (rows from row_lo, of row_len floats) into dst.
void ImageTransform::verticalPass(int i, int row_lo, std::size_t row_len, float* dst) const {
  const float* w = down_.weights.data() + static_cast<std::size_t>(i) * down_.stride;
  for (int k = 0; k < down_.count[i]; ++k) {
    const float* src =
        rows_.data() + static_cast<std::size_t>(down_.first[i] + k - row_lo) * row_len;
    const float wk = w[k];
    if (k == 0) {
#pragma omp simd
      for (std::size_t x = 0; x < row_len; ++x)
        dst[x] = wk * src[x];
    } else {
#pragma omp simd
      for (std::size_t x = 0; x < row_len; ++x)
        dst[x] += wk * src[x];
    }
  }
}

// Output row i from `row` (width_ pixels, `lanes` floats each): mirrored, normalised and laid out.
template <typename T>
void ImageTransform::layOutRow(const float* row, int i, int lanes, bool mirror, T* out) const {
  const int c = channels_;
  const std::size_t plane = static_cast<std::size_t>(height_) * width_;
  const bool nchw = options_.layout == Layout::kNchw;
  for (int k = 0; k < c; ++k) {
    const float mean = mean_[k], scale = scale_[k];
    // NCHW: the row of plane k; NHWC: every c-th value of the row from k.
    T* dst = nchw ? out + k * plane + static_cast<std::size_t>(i) * width_
                  : out + static_cast<std::size_t>(i) * width_ * c + k;
    const float* src = row + k;
    auto value = [&](std::size_t x) {
      const float v = src[x * lanes];
      return store<T>(std::is_same_v<T, float> ? (v - mean) * scale : v);
    };
    const auto w = static_cast<std::size_t>(width_);
    if (nchw && !mirror) {  // the common case, in loops the compiler makes SIMD
#pragma omp simd
      for (std::size_t j = 0; j < w; ++j)
        dst[j] = value(j);
    } else if (nchw) {
#pragma omp simd
      for (std::size_t j = 0; j < w; ++j)
        dst[j] = value(w - 1 - j);
    } else {
      for (std::size_t j = 0; j < w; ++j)
        dst[j * c] = value(mirror ? w - 1 - j : j);
    }
  }
}

template <typename T>
void ImageTransform::resample(const Image& source, const Window& window, T* out) {
  const int c = channels_;
  TROUPE_ENFORCE_EQ(source.channels, c);
  const Reach area = reach();
  TROUPE_ENFORCE(area.col_lo >= 0 && area.row_lo >= 0 && area.col_hi <= source.width &&
                     area.row_hi <= source.height,
                 "the filter reads past the ", source.width, "x", source.height, " pixels decoded");
  // From here on a colour pixel is 4 floats (B, G, R and a lane that is never read), so that each
  // tap is one 4-wide multiply-add, which the compiler makes SIMD at the baseline ISA; gray is 1.
  const int lanes = c == 3 ? 4 : 1;
  sourceToFloats(source, area, lanes);
  horizontalPass(area, lanes);
  // Vertical pass, a row of the output at a time: into pixels_ (H x W x lanes, 0..255) when colour
  // jitter needs the whole image, else into one row that is laid out at once, while in cache.
  const std::size_t row_len = static_cast<std::size_t>(width_) * lanes;
  const bool whole = window.brightness != 1 || window.contrast != 1 || window.saturation != 1;
  pixels_.resize(whole ? static_cast<std::size_t>(height_) * row_len : row_len);
  if (whole) {
    for (int i = 0; i < height_; ++i)
      verticalPass(i, area.row_lo, row_len, pixels_.data() + static_cast<std::size_t>(i) * row_len);
    jitter(window);
  }
  for (int i = 0; i < height_; ++i) {
    float* row = pixels_.data() + (whole ? static_cast<std::size_t>(i) * row_len : 0);
    if (!whole) verticalPass(i, area.row_lo, row_len, row);
    layOutRow(row, i, lanes, window.mirror, out);
  }
}

ImageSize shortSideResized(int height, int width, int short_side) {
  const double s = static_cast<double>(short_side) / std::min(height, width);
  return {std::max(1, static_cast<int>(std::lround(height * s))),
          std::max(1, static_cast<int>(std::lround(width * s)))};
}

Image resizeAntialiased(const Image& image, int height, int width) {
  if (height < 1 || width < 1) {
    throw InputError(detail::concat("cannot resize an image to ", height, "x", width));
  }
  ImageTransformOptions options;
  options.layout = Layout::kNhwc;
  ImageTransform t(options, false, image.channels, height, width);
  ImageTransform::Window whole;
  whole.width = image.width;
  whole.height = image.height;
  t.planTaps(whole, 1, image.height, image.width);
  Image out;
  out.height = height;
  out.width = width;
  out.channels = image.channels;
  out.pixels.resize(static_cast<std::size_t>(height) * width * image.channels);
  t.resample(image, whole, out.pixels.data());
  return out;
}

void ImageTransform::jitter(const Window& window) {
  if (window.brightness == 1 && window.contrast == 1 && window.saturation == 1) return;
  auto clamp255 = [](float v) { return std::clamp(v, 0.0f, 255.0f); };
  std::vector<float>& p = pixels_;  // resample's layout: a colour pixel in 4 lanes, gray in 1
  const int c = channels_;
  const std::size_t lanes = c == 3 ? 4 : 1;
  const std::size_t n = static_cast<std::size_t>(height_) * width_;
  // Luma of BGR as torchvision's grayscale: 0.299 R + 0.587 G + 0.114 B.
  auto gray = [&](std::size_t i) {
    const float* q = p.data() + lanes * i;
    return c == 1 ? q[0] : 0.114f * q[0] + 0.587f * q[1] + 0.299f * q[2];
  };
  if (window.brightness != 1) {
    for (float& v : p)
      v = clamp255(v * window.brightness);
  }
  if (window.contrast != 1) {
    double sum = 0;
    for (std::size_t i = 0; i < n; ++i)
      sum += gray(i);
    const auto mean = static_cast<float>(sum / static_cast<double>(n));
    for (float& v : p)
      v = clamp255(mean + window.contrast * (v - mean));
  }
  if (window.saturation != 1 && c == 3) {
    for (std::size_t i = 0; i < n; ++i) {
      const float g = gray(i);
      for (std::size_t k = 0; k < 3; ++k)
        p[lanes * i + k] = clamp255(g + window.saturation * (p[lanes * i + k] - g));
    }
  }
}

}  // namespace troupe::data
