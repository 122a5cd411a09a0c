// Private to data/ (and its tests and benchmarks): the image input of Caffe2's ImageInput op and
// of the Inception/torchvision training recipe, from an encoded (JPEG, PNG) or raw image of any
// size to a fixed-size float (or uint8) tensor, in one pass:
//   training: random-resized crop (area and aspect ratio drawn, then resized to crop x crop) or
//             resize_short then a random crop; random mirror; colour jitter;
//   testing:  resize_short then a centre crop (random-resized crop runs test with resize_short,
//             by default crop / 0.875, as torchvision's recipe: 256 for 224);
// then (value - mean_c) / std_c per channel. Only the part of a JPEG that the crop needs is
// decoded, at 1/2, 1/4 or 1/8 of its size (DCT-domain scaling) when the crop is that much larger
// than the output. Resampling is a separable triangle filter whose support widens with the
// downscale factor (antialiased, as Pillow's and DALI's linear resize), pixel centres aligned.
//
// Determinism: every draw comes from the SplitMix64 the caller passes, which Dataset seeds per
// (seed, epoch, record): the same record gets the same crop in every run, process and thread.
// Errors: InputError naming what is wrong (not an image, truncated, a crop larger than the image,
// an image over kMaxImagePixels); the caller adds the record.
// Thread safety: one ImageTransform per thread (it keeps buffers).
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

#include "data/image.h"

namespace troupe::data {

class SplitMix64;

enum class Layout { kNchw, kNhwc };

struct ImageTransformOptions {
  int resize_short = 0;  // Caffe2's scale: the short side is resized to this first (0: not)
  int crop = 0;          // output height and width (0: the image's own size, which must be fixed)
  int pad = 0;           // training crops may reach this many pixels past each edge (value 0)
  bool random_resized_crop = false;
  double min_area = 0.08, max_area = 1.0;                 // of the image, for random_resized_crop
  double min_aspect = 3.0 / 4.0, max_aspect = 4.0 / 3.0;  // width / height, drawn log-uniform
  bool mirror = false;  // training: flip left-right with probability 1/2
  // Training: brightness, contrast and saturation factors drawn from [1 - j, 1 + j], applied in
  // that order to the 0..255 values (torchvision's ColorJitter without hue, in a fixed order).
  float brightness = 0, contrast = 0, saturation = 0;
  Layout layout = Layout::kNchw;

  // Anything to do beyond decoding a fixed-size image.
  bool active() const {
    return resize_short > 0 || crop > 0 || random_resized_crop || mirror || brightness > 0 ||
           contrast > 0 || saturation > 0 || layout != Layout::kNchw;
  }
};

// The whole image resized to height x width with the transform's antialiased filter (what
// `troupe convert images --resize` stores). InputError for a size below 1.
Image resizeAntialiased(const Image& image, int height, int width);

// A height x width image's size once its short side is resized to short_side (resize_short,
// Caffe2's scale), the aspect ratio kept: each side rounded to the nearest pixel, at least 1.
struct ImageSize {
  int height = 0, width = 0;
};
ImageSize shortSideResized(int height, int width, int short_side);

class ImageTransform {
 public:
  // `train` draws the random crop, mirror and jitter; otherwise centre crops and nothing random.
  // out_channels is 1 or 3; out_height x out_width is crop x crop when crop > 0. Values become
  // (value - mean[c]) * scale[c], one element applying to every channel. InputError for options
  // that contradict each other, a mean or scale of another length than out_channels.
  ImageTransform(const ImageTransformOptions& options, bool train, int out_channels, int out_height,
                 int out_width, std::vector<float> mean = {0.0f},
                 std::vector<float> scale = {1.0f});

  // An encoded image (JPEG or PNG, any size) to out: C x H x W floats (or H x W x C for kNhwc).
  void encoded(std::string_view bytes, SplitMix64& rng, float* out);
  // The same as uint8 values, before the mean and scale (normalised later, on the device).
  void encoded(std::string_view bytes, SplitMix64& rng, std::uint8_t* out);
  // A raw image, C x H x W uint8 as Caffe stores it.
  void raw(const std::uint8_t* chw, int channels, int height, int width, SplitMix64& rng,
           float* out);
  void raw(const std::uint8_t* chw, int channels, int height, int width, SplitMix64& rng,
           std::uint8_t* out);

  // Where the output's pixels come from, in the image's pixels (floats: resized crops start
  // between pixels), drawn as encoded() draws it; for tests.
  struct Window {
    double x = 0, y = 0, width = 0, height = 0;
    bool mirror = false;
    float brightness = 1, contrast = 1, saturation = 1;
  };
  Window window(int height, int width, SplitMix64& rng) const;

 private:
  struct Taps {
    std::vector<int> first;      // per output pixel: its first source pixel
    std::vector<int> count;      // and how many it reads
    std::vector<float> weights;  // count weights per output pixel, at a stride of `stride`
    int stride = 0;
  };

  template <typename T>
  void encodedTo(std::string_view bytes, SplitMix64& rng, T* out);
  template <typename T>
  void rawTo(const std::uint8_t* chw, int channels, int height, int width, SplitMix64& rng, T* out);
  template <typename T>
  void fromWhole(const Window& window, T* out);
  template <typename T>
  void fromPadded(Window window, T* out);
  // The filter's taps for the window, in the pixels of the image scaled by 1/scale_down.
  void planTaps(const Window& window, int scale_down, int full_height, int full_width);
  static void shiftTaps(Taps& t, int origin);
  // source holds every pixel the taps read.
  template <typename T>
  void resample(const Image& source, const Window& window, T* out);
  // resample's steps. The source's pixels that the filter reads: rows [row_lo, row_hi), columns
  // [col_lo, col_hi) (first taps grow with the output pixel, so the last is the farthest).
  struct Reach {
    int row_lo, row_hi, col_lo, col_hi;
  };
  Reach reach() const;
  void sourceToFloats(const Image& source, const Reach& area, int lanes);
  void horizontalPass(const Reach& area, int lanes);
  void verticalPass(int i, int row_lo, std::size_t row_len, float* dst) const;
  template <typename T>
  void layOutRow(const float* row, int i, int lanes, bool mirror, T* out) const;
  void jitter(const Window& window);
  friend Image resizeAntialiased(const Image& image, int height, int width);

  ImageTransformOptions options_;
  bool train_;
  int channels_, height_, width_;
  std::vector<float> mean_, scale_;  // per output channel
  ImageRegion region_;
  Image image_, padded_;
  // resample's buffers; a colour pixel is 4 floats in them (B, G, R, unused), a gray one 1.
  std::vector<float> source_;  // the source's pixels the filter reads
  std::vector<float> rows_;    // the horizontal pass: source rows x width
  std::vector<float> pixels_;  // the output before normalisation: height x width
  Taps across_, down_;
};

}  // namespace troupe::data
