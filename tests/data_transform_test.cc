#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <png.h>
#include <turbojpeg.h>
#include <zlib.h>

#include <fmt/core.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <numeric>
#include <thread>
#include <vector>

#include "data/dataset.h"
#include "data/db.h"
#include "data/image.h"
#include "data/image_transform.h"
#include "data/thread_team.h"
#include "data_test_util.h"
#include "kernels/backend.h"
#include "troupe/error.h"

namespace troupe::data {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using namespace testing;

// A photograph's stand-in: smooth shading, edges and fine texture, in BGR.
Image photo(int height, int width, int channels = 3) {
  return imageOf(height, width, channels, [](int y, int x, int c) {
    const double v = 128 + 60 * std::sin(x * 0.05 + c) * std::cos(y * 0.03) +
                     30 * ((x / 40 + y / 30) % 2) + 20 * std::sin(x * 0.7 + y * 0.9 + c);
    return static_cast<std::uint8_t>(std::clamp(v, 0.0, 255.0));
  });
}

std::uint8_t at(const Image& image, int y, int x, int c) {
  return image.pixels[(static_cast<std::size_t>(y) * image.width + x) * image.channels + c];
}

TEST(JpegRegion, HoldsTheSamePixelsAsTheWholeImageDecoded) {
  const std::string jpeg = encodeJpeg(photo(375, 500), 90);
  Image whole;
  decodeImage(jpeg, 3, whole);
  // Edges at odd and even rows and columns, inside the image and at its edges.
  for (const Rect want : {Rect{0, 0, 500, 375}, Rect{123, 77, 200, 150}, Rect{300, 200, 200, 175},
                          Rect{1, 1, 1, 1}, Rect{250, 188, 3, 2}, Rect{17, 31, 483, 344}}) {
    ImageRegion region;
    decodeJpegRegion(jpeg, 1, want, 3, region);
    ASSERT_EQ(region.full_width, 500);
    ASSERT_EQ(region.full_height, 375);
    // The region comes with a margin (wider on the left, to an iMCU boundary).
    EXPECT_LE(region.x, want.x);
    EXPECT_LE(region.y, want.y);
    EXPECT_GE(region.x + region.image.width, want.x + want.width);
    EXPECT_GE(region.y + region.image.height, want.y + want.height);
    // Inside the region, every pixel is the whole decode's: no tolerance.
    int differ = 0;
    for (int y = want.y; y < want.y + want.height; ++y)
      for (int x = want.x; x < want.x + want.width; ++x)
        for (int c = 0; c < 3; ++c)
          differ += at(region.image, y - region.y, x - region.x, c) != at(whole, y, x, c);
    EXPECT_EQ(differ, 0) << "region " << want.x << "," << want.y;
  }
}

TEST(JpegRegion, ScaledByADenominatorIsTheImageAveragedOverBlocks) {
  const Image original = photo(240, 320);
  const std::string jpeg = encodeJpeg(original, 95);
  for (const int d : {2, 4, 8}) {
    ImageRegion region;
    decodeJpegRegion(jpeg, d, Rect{0, 0, 1000, 1000}, 3, region);
    ASSERT_EQ(region.full_width, scaledJpegSide(320, d));
    ASSERT_EQ(region.full_height, scaledJpegSide(240, d));
    ASSERT_EQ(region.image.width, region.full_width);
    // Against the d x d box average of the original: a scaled IDCT keeps the block's low
    // frequencies, which the box average also keeps but for the texture of period < 2d pixels
    // (amplitude 20 here, averaged out by both up to a few levels), plus quality 95's
    // quantisation error (a level or two). The mean absolute difference stays below 6 levels;
    // a decode at the wrong scale or offset is off by tens.
    double sum = 0;
    for (int y = 0; y < region.image.height; ++y) {
      for (int x = 0; x < region.image.width; ++x) {
        for (int c = 0; c < 3; ++c) {
          double box = 0;
          for (int dy = 0; dy < d; ++dy)
            for (int dx = 0; dx < d; ++dx)
              box += at(original, y * d + dy, x * d + dx, c);
          sum += std::abs(box / (d * d) - at(region.image, y, x, c));
        }
      }
    }
    EXPECT_LT(sum / (region.image.height * region.image.width * 3), 6.0) << "1/" << d;
  }
}

TEST(JpegRegion, ATruncatedOrCmykJpegIsRefusedAsSuch) {
  const std::string jpeg = encodeJpeg(photo(64, 64), 90);
  ImageRegion region;
  EXPECT_THAT(errorOf([&] {
                decodeJpegRegion(jpeg.substr(0, jpeg.size() / 2), 1, Rect{0, 0, 64, 64}, 3, region);
              }),
              HasSubstr("truncated"));
  // A CMYK JPEG, as TurboJPEG writes one.
  tjhandle tj = tjInitCompress();
  std::vector<unsigned char> cmyk(64 * 64 * 4, 100);
  unsigned char* buffer = nullptr;
  unsigned long size = 0;
  ASSERT_EQ(tjCompress2(tj, cmyk.data(), 64, 0, 64, TJPF_CMYK, &buffer, &size, TJSAMP_444, 90, 0),
            0);
  const std::string cmyk_jpeg(reinterpret_cast<char*>(buffer), size);
  tjFree(buffer);
  tjDestroy(tj);
  EXPECT_THAT(errorOf([&] {
                decodeJpegRegion(cmyk_jpeg, 1, Rect{0, 0, 64, 64}, 3, region);
              }),
              HasSubstr("CMYK"));
  EXPECT_THAT(errorOf([&] {
                decodeJpegRegion(jpeg, 3, Rect{0, 0, 64, 64}, 3, region);
              }),
              HasSubstr("only 1, 2, 4 or 8"));
}

// A bad header leaves the thread's decoder fit for the next record: TurboJPEG's header read
// returns from libjpeg's error mid-header, and a good image after it read as the rest of that
// header ("Bogus DQT index 15"), so that with skip_bad_records every record after a bad one on
// that thread would have been skipped too.
TEST(JpegHeader, AGoodImageAfterABadHeaderOnTheSameThreadIsRead) {
  const std::string jpeg = encodeJpeg(photo(48, 64), 90);
  EXPECT_THAT(errorOf([&] { probeImage(jpeg.substr(0, 24)); }), HasSubstr("bad JPEG header"));
  const ImageInfo info = probeImage(jpeg);
  EXPECT_EQ(info.height, 48);
  EXPECT_EQ(info.width, 64);
  EXPECT_EQ(info.channels, 3);
}

// A bad JPEG header's error says what libjpeg found in that record, even while other threads
// probe other bad records: TurboJPEG keeps libjpeg's text in one string for the whole process. A
// stream with no image in it (TurboJPEG's header read passes one, with no size) is one.
TEST(JpegHeader, BadHeadersProbedFromManyThreadsEachSayTheirOwnError) {
  const std::string jpeg = encodeJpeg(photo(64, 64), 90);
  const std::string no_image("\xFF\xD8\xFF\xD9", 4);  // a start, then the end of the image
  const std::vector<std::string> bad{jpeg.substr(0, 24), no_image};
  std::vector<std::string> expected;
  for (const auto& b : bad)
    expected.push_back(errorOf([&] { probeImage(b); }));
  ASSERT_THAT(expected[0], HasSubstr("bad JPEG header"));
  ASSERT_THAT(expected[1], HasSubstr("bad JPEG header"));
  ASSERT_NE(expected[0], expected[1]);
  std::atomic<int> wrong{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&, t] {
      for (int round = 0; round < 300; ++round) {
        const std::size_t k = static_cast<std::size_t>(t + round) % bad.size();
        if (errorOf([&] { probeImage(bad[k]); }) != expected[k]) ++wrong;
      }
    });
  }
  for (auto& thread : threads)
    thread.join();
  EXPECT_EQ(wrong.load(), 0) << expected[0] << " / " << expected[1];
}

// The transform of the whole image at its own size, with no draw, is the normalisation only.
TEST(ImageTransform, WithNothingToDoIsTheNormalisationOfEveryPixel) {
  const Image image = photo(20, 30);
  ImageTransformOptions options;
  options.layout = Layout::kNchw;
  ImageTransform t(options, /*train=*/false, 3, 20, 30, {10, 20, 30}, {0.5f, 0.25f, 2});
  std::vector<float> out(3 * 20 * 30);
  SplitMix64 rng(1);
  t.encoded(encodePng(image), rng, out.data());
  const float mean[] = {10, 20, 30}, scale[] = {0.5f, 0.25f, 2};
  for (int c = 0; c < 3; ++c)
    for (int y = 0; y < 20; ++y)
      for (int x = 0; x < 30; ++x)  // weights of exactly 1: the same float operations
        ASSERT_EQ(out[(c * 20 + y) * 30 + x], (at(image, y, x, c) - mean[c]) * scale[c]);
}

TEST(ImageTransform, ACentreCropIsThePixelsOfTheCentre) {
  const Image image = photo(50, 70);
  ImageTransformOptions options;
  options.crop = 32;
  ImageTransform t(options, /*train=*/false, 3, 32, 32);
  std::vector<float> out(3 * 32 * 32);
  SplitMix64 rng(1);
  t.encoded(encodePng(image), rng, out.data());
  for (int c = 0; c < 3; ++c)
    for (int y = 0; y < 32; ++y)
      for (int x = 0; x < 32; ++x)
        ASSERT_EQ(out[(c * 32 + y) * 32 + x], at(image, y + 9, x + 19, c));
}

// Resizing the short side, then a centre crop, against the whole image resized by a plain
// triangle filter (written out here) and then cropped.
TEST(ImageTransform, ResizeShortThenCropIsTheCropOfTheWholeImageResized) {
  const Image image = photo(90, 120);
  ImageTransformOptions options;
  options.resize_short = 40;  // 90x120 -> 40x53, a crop of 32 at (4, 10)
  options.crop = 32;
  ImageTransform t(options, /*train=*/false, 3, 32, 32);
  std::vector<float> out(3 * 32 * 32);
  SplitMix64 rng(1);
  t.encoded(encodePng(image), rng, out.data());
  auto weights = [](int n_out, int n_in, int j) {
    const double f = static_cast<double>(n_in) / n_out, r = std::max(1.0, f);
    const double centre = (j + 0.5) * f - 0.5;
    std::vector<double> w(static_cast<std::size_t>(n_in), 0.0);
    double sum = 0;
    for (int k = 0; k < n_in; ++k) {
      w[k] = std::max(0.0, 1 - std::abs(k - centre) / r);
      sum += w[k];
    }
    for (double& v : w)
      v /= sum;
    return w;
  };
  const int rh = 40, rw = 53, y0 = (rh - 32) / 2, x0 = (rw - 32) / 2;
  for (int c = 0; c < 3; ++c) {
    for (int y = 0; y < 32; ++y) {
      const auto wy = weights(rh, 90, y + y0);
      for (int x = 0; x < 32; ++x) {
        const auto wx = weights(rw, 120, x + x0);
        double v = 0;
        for (int i = 0; i < 90; ++i)
          for (int k = 0; k < 120; ++k)
            v += wy[i] * wx[k] * at(image, i, k, c);
        // Float sums of at most 3 x 3 taps of values <= 255 with weights summing to 1 (and float
        // weights, each within 2^-24 relative): |error| <= ~10 * 2^-24 * 255 < 1e-3.
        ASSERT_NEAR(out[(c * 32 + y) * 32 + x], v, 1e-3) << c << " " << y << " " << x;
      }
    }
  }
}

TEST(ImageTransform, RandomResizedCropsStayInsideTheImageWithTheirAreaAndAspect) {
  ImageTransformOptions options;
  options.random_resized_crop = true;
  options.crop = 224;
  ImageTransform t(options, /*train=*/true, 3, 224, 224);
  SplitMix64 rng(7);
  int fallbacks = 0;
  double area_sum = 0;
  for (int i = 0; i < 2000; ++i) {
    const auto w = t.window(375, 500, rng);
    ASSERT_GE(w.x, 0);
    ASSERT_GE(w.y, 0);
    ASSERT_LE(w.x + w.width, 500);
    ASSERT_LE(w.y + w.height, 375);
    const double area = w.width * w.height / (375.0 * 500.0);
    const double aspect = w.width / w.height;
    if (w.width == 500 && w.height == 375) {
      ++fallbacks;
      continue;
    }
    // Rounding each side to whole pixels moves the area and aspect by under 1% at these sizes.
    EXPECT_GE(area, 0.08 * 0.99);
    EXPECT_LE(area, 1.0);
    EXPECT_GE(aspect, 0.75 * 0.99);
    EXPECT_LE(aspect, 4.0 / 3.0 * 1.01);
    area_sum += area;
  }
  // Fallbacks need ten misses in a row; a try misses when a side does not fit (about a third of
  // the draws here), so they are rare. The mean area of the crops that fit lies below the
  // uniform draw's 0.54, since large areas miss more often.
  EXPECT_LT(fallbacks, 20);
  const double mean_area = area_sum / (2000 - fallbacks);
  EXPECT_GT(mean_area, 0.3);
  EXPECT_LT(mean_area, 0.54);
}

TEST(ImageTransform, MirrorFlipsTheColumnsOfHalfTheDraws) {
  const Image image = photo(16, 24);
  const std::string png = encodePng(image);
  ImageTransformOptions options;
  options.mirror = true;
  ImageTransform t(options, /*train=*/true, 3, 16, 24);
  std::vector<float> out(3 * 16 * 24);
  int mirrored = 0;
  for (std::uint64_t seed = 0; seed < 200; ++seed) {
    SplitMix64 draw(seed), rng(seed);
    const bool mirror = t.window(16, 24, draw).mirror;
    t.encoded(png, rng, out.data());
    mirrored += mirror;
    for (int y = 0; y < 16; ++y)
      for (int x = 0; x < 24; ++x)
        ASSERT_EQ(out[(1 * 16 + y) * 24 + x], at(image, y, mirror ? 23 - x : x, 1));
  }
  // Binomial(200, 1/2): within 100 +- 40 but with probability ~1e-8.
  EXPECT_GT(mirrored, 60);
  EXPECT_LT(mirrored, 140);
}

TEST(ImageTransform, JpegCropsDecodedInPartMatchTheWholeImageDecoded) {
  // The same image as a JPEG (decoded in part, at a DCT scale) and as the PNG of its whole
  // decode (no scaling): crops to 64 x 64 of 375 x 500, half of them at 1/2 or 1/4 scale.
  const std::string jpeg = encodeJpeg(photo(375, 500), 90);
  Image whole;
  decodeImage(jpeg, 3, whole);
  const std::string png = encodePng(whole);
  ImageTransformOptions options;
  options.random_resized_crop = true;
  options.crop = 64;
  ImageTransform a(options, /*train=*/true, 3, 64, 64), b(options, /*train=*/true, 3, 64, 64);
  std::vector<float> from_jpeg(3 * 64 * 64), from_png(3 * 64 * 64);
  for (std::uint64_t seed = 0; seed < 40; ++seed) {
    SplitMix64 r1(seed), r2(seed), r3(seed);
    const auto w = a.window(375, 500, r3);
    a.encoded(jpeg, r1, from_jpeg.data());
    b.encoded(png, r2, from_png.data());
    double diff = 0;
    for (std::size_t i = 0; i < from_jpeg.size(); ++i)
      diff += std::abs(from_jpeg[i] - from_png[i]);
    diff /= static_cast<double>(from_jpeg.size());
    // At scale 1 the decoded pixels are the same and so are the outputs (float sums in the same
    // order). At 1/2 or 1/4, the scaled IDCT stands in for the filter's first halvings: both
    // average over the same pixels, and differ by the texture each leaves (a few levels).
    if (w.width < 128 || w.height < 128) {
      EXPECT_EQ(diff, 0) << "seed " << seed;
    } else {
      EXPECT_LT(diff, 6) << "seed " << seed;
    }
  }
}

TEST(ImageTransform, ColourJitterKeepsValuesInRangeAndChangesThem) {
  const std::string png = encodePng(photo(32, 32));
  ImageTransformOptions options;
  options.brightness = options.contrast = options.saturation = 0.4f;
  ImageTransform jittered(options, /*train=*/true, 3, 32, 32);
  ImageTransform plain(ImageTransformOptions{}, /*train=*/true, 3, 32, 32);
  std::vector<float> a(3 * 32 * 32), b(3 * 32 * 32);
  SplitMix64 r1(3), r2(3);
  jittered.encoded(png, r1, a.data());
  plain.encoded(png, r2, b.data());
  EXPECT_NE(a, b);
  for (const float v : a) {
    ASSERT_GE(v, 0);
    ASSERT_LE(v, 255);
  }
  // Testing draws nothing: no jitter.
  ImageTransform test(options, /*train=*/false, 3, 32, 32);
  SplitMix64 r3(3);
  test.encoded(png, r3, a.data());
  EXPECT_EQ(a, b);
}

TEST(ImageTransform, Uint8AndNhwcOutputsHoldTheSameValues) {
  const std::string png = encodePng(photo(40, 40));
  ImageTransformOptions options;
  options.crop = 32;
  ImageTransform chw(options, false, 3, 32, 32);
  options.layout = Layout::kNhwc;
  ImageTransform hwc(options, false, 3, 32, 32);
  std::vector<float> a(3 * 32 * 32);
  std::vector<std::uint8_t> b(3 * 32 * 32);
  SplitMix64 r1(1), r2(1);
  chw.encoded(png, r1, a.data());
  hwc.encoded(png, r2, b.data());
  for (int c = 0; c < 3; ++c)
    for (int i = 0; i < 32 * 32; ++i)
      ASSERT_EQ(b[i * 3 + c], static_cast<std::uint8_t>(a[c * 32 * 32 + i]));
}

TEST(ImageTransform, BadImagesAndOptionsAreRefusedSayingWhy) {
  ImageTransformOptions options;
  options.crop = 24;
  ImageTransform t(options, /*train=*/false, 3, 24, 24);
  std::vector<float> out(3 * 24 * 24);
  SplitMix64 rng(1);
  EXPECT_THAT(errorOf([&] { t.encoded(encodePng(photo(1, 1)), rng, out.data()); }),
              HasSubstr("is 1x1, smaller than the crop 24x24"));
  EXPECT_THAT(errorOf([&] { t.encoded("GIF89a", rng, out.data()); }),
              HasSubstr("not a JPEG or PNG"));
  // A 1x1 image resized (random-resized crop, or resize_short) is upsampled, as torchvision does.
  options.random_resized_crop = true;
  ImageTransform rrc(options, /*train=*/true, 3, 24, 24);
  rrc.encoded(encodePng(photo(1, 1)), rng, out.data());
  EXPECT_EQ(out[0], out[24 * 24 - 1]);
  // A PNG whose header claims 20000 x 20000 pixels (its CRC fixed): over the limit, not decoded.
  std::string png = encodePng(photo(8, 8));
  for (const int offset : {16, 20}) {
    const std::uint32_t side = 20000;
    const unsigned char be[] = {0, 0, side >> 8, side & 0xff};
    std::memcpy(png.data() + offset, be, 4);
  }
  const auto crc =
      static_cast<std::uint32_t>(crc32(0, reinterpret_cast<const Bytef*>(png.data() + 12), 17));
  const unsigned char crc_be[] = {
      static_cast<unsigned char>(crc >> 24), static_cast<unsigned char>(crc >> 16),
      static_cast<unsigned char>(crc >> 8), static_cast<unsigned char>(crc)};
  std::memcpy(png.data() + 29, crc_be, 4);
  EXPECT_THAT(errorOf([&] { rrc.encoded(png, rng, out.data()); }),
              HasSubstr("is a 20000x20000 image, over the limit of 100000000 pixels"));
  EXPECT_THAT(errorOf([] {
                ImageTransform(ImageTransformOptions{}, false, 3, 8, 8, {1, 2});
              }),
              HasSubstr("mean_per_channel has 2 values for images of 3 channels"));
  ImageTransformOptions no_crop;
  no_crop.resize_short = 256;
  EXPECT_THAT(errorOf([&] { ImageTransform(no_crop, false, 3, 8, 8); }), HasSubstr("need crop"));
}

TEST(ThreadTeam, RunsEveryIterationOnceAndRethrowsTheFirstError) {
  ThreadTeam team(3);
  std::vector<std::atomic<int>> hits(1000);
  std::atomic<int> bad_member{0};
  team.run(1000, [&](std::int64_t i, int member) {
    if (member < 0 || member >= 3) ++bad_member;
    ++hits[static_cast<std::size_t>(i)];
  });
  for (const auto& h : hits)
    ASSERT_EQ(h.load(), 1);
  EXPECT_EQ(bad_member.load(), 0);
  EXPECT_THAT(errorOf([&] {
                team.run(100, [](std::int64_t i, int) {
                  if (i == 37 || i == 80) throw InputError(fmt::format("iteration {}", i));
                });
              }),
              HasSubstr("iteration 37"));
}

// An LMDB of n JPEG records (quality 90) of image(i), labels i % 10, keys "%08d".
template <typename MakeImage>
void writeJpegDb(const std::string& path, int n, MakeImage image) {
  std::vector<std::string> records;
  for (int i = 0; i < n; ++i) {
    RawDatum d;
    d.encoded = true;
    d.data = encodeJpeg(image(i), 90);
    d.label = i % 10;
    records.push_back(testing::datumBytes(d));
  }
  testing::writeDb(path, DbType::kLmdb, records);
}

// The ResNet training input at `size`: random-resized crops, mirror, per-channel mean and std.
DatasetOptions trainingCrops(const std::string& path, int size) {
  DatasetOptions o;
  o.path = path;
  o.channels = 3;
  o.height = o.width = size;
  o.train = true;
  o.transform.random_resized_crop = true;
  o.transform.crop = size;
  o.transform.mirror = true;
  o.mean_per_channel = {104, 117, 123};
  o.std_per_channel = {57, 57, 58};
  return o;
}

// A database of JPEGs of several sizes, read as a training set: crops of any size, the same with
// one decoder or three, the same again for the same epoch and other for the next.
TEST(TransformedDataset, ReadsJpegsOfAnySizeTheSameWithAnyNumberOfThreads) {
  TempDir dir;
  const std::string path = dir / "jpegs";
  writeJpegDb(path, 24, [](int i) { return photo(100 + 13 * i, 180 - 5 * i); });
  DatasetOptions o = trainingCrops(path, 64);
  std::vector<std::int64_t> indices(24);
  std::iota(indices.begin(), indices.end(), 0);
  std::reverse(indices.begin(), indices.end());
  auto readAll = [&](int threads, std::int64_t epoch) {
    o.decode_threads = threads;
    auto dataset = openDataset(o);
    std::vector<float> images(24 * 3 * 64 * 64);
    std::vector<std::int32_t> labels(24);
    dataset->read(indices, epoch, images.data(), labels.data());
    for (int i = 0; i < 24; ++i)
      EXPECT_EQ(labels[i], (23 - i) % 10);
    return images;
  };
  const auto one = readAll(1, 5);
  EXPECT_EQ(readAll(3, 5), one);
  EXPECT_NE(readAll(1, 6), one);
  // Normalised by the per-channel mean and std: values of 0..255 land in about [-2.2, 2.4].
  const auto [lo, hi] = std::minmax_element(one.begin(), one.end());
  EXPECT_GE(*lo, -123.0f / 57);
  EXPECT_LE(*hi, (255.0f - 104) / 57);
}

// input_dtype uint8: the same crops as bytes before the mean and std; normalised (the CPU backend's
// normalise, as a replica on the CPU does) they are the float read's values up to the rounding of
// each value to a byte, half a level:
// |float - (byte - mean) / std| <= 0.5 / std. Raw records without a transform are exact.
TEST(TransformedDataset, Uint8ImagesAreTheFloatOnesBeforeTheMeanAndStd) {
  TempDir dir;
  const std::string path = dir / "jpegs";
  writeJpegDb(path, 8, [](int i) { return photo(90 + 11 * i, 150 - 7 * i); });
  DatasetOptions o = trainingCrops(path, 48);
  const std::vector<std::int64_t> indices = {3, 1, 7, 0, 5};
  const std::size_t n = indices.size() * 3 * 48 * 48;
  const kernels::Shape shape{static_cast<std::int64_t>(indices.size()), 3, 48, 48};
  std::vector<float> floats(n);
  const auto bytes = kernels::Tensor::host(shape, kernels::DType::kUInt8);
  const auto normalised = kernels::Tensor::host(shape);
  std::vector<std::int32_t> labels(indices.size()), byte_labels(indices.size());
  auto dataset = openDataset(o);
  dataset->read(indices, 2, floats.data(), labels.data());
  o.uint8 = true;
  openDataset(o)->read(indices, 2, static_cast<std::uint8_t*>(bytes.raw()), byte_labels.data());
  EXPECT_EQ(labels, byte_labels);
  const auto norm = normalisationOf(o);
  kernels::makeCpuBackend(2)->normalise(bytes, normalised, norm.mean, norm.scale);
  for (std::size_t j = 0; j < n; ++j) {
    const float scale = norm.scale[(j / (48 * 48)) % 3];
    ASSERT_LE(std::abs(floats[j] - normalised.f32()[j]), 0.5f * scale * (1 + 1e-5f))
        << "value " << j;
  }

  // A memory dataset has no bytes to give.
  DatasetOptions memory = o;
  memory.path = "memory://uint8";
  EXPECT_EQ(errorOf([&] { openDataset(memory); }),
            "dataset 'memory://uint8' holds float images: input_dtype uint8 needs a database");
}

TEST(TransformedDataset, ABadRecordIsNamedWhicheverThreadReadsIt) {
  TempDir dir;
  const std::string path = dir / "jpegs";
  std::vector<std::string> records;
  for (int i = 0; i < 8; ++i) {
    RawDatum d;
    d.encoded = true;
    d.data = encodeJpeg(photo(60, 80), 90);
    if (i == 5) d.data.resize(d.data.size() / 3);   // truncated
    if (i == 6) d.data = encodePng(photo(10, 10));  // too small for the crop
    records.push_back(testing::datumBytes(d));
  }
  testing::writeDb(path, DbType::kLevelDb, records);
  DatasetOptions o;
  o.path = path;
  o.type = DbType::kLevelDb;
  o.channels = 3;
  o.height = o.width = 32;
  o.transform.crop = 32;
  o.decode_threads = 2;
  auto dataset = openDataset(o);
  std::vector<float> images(8 * 3 * 32 * 32);
  std::vector<std::int32_t> labels(8);
  EXPECT_THAT(errorOf([&] {
                dataset->read({0, 1, 2, 3, 4, 5, 6, 7}, 0, images.data(), labels.data());
              }),
              AllOf(HasSubstr("record '00000005'"), HasSubstr("truncated")));
  EXPECT_THAT(errorOf([&] {
                dataset->read({7, 6}, 0, images.data(), labels.data());
              }),
              HasSubstr("record '00000006' is 10x10, smaller than the crop 32x32"));
}

}  // namespace
}  // namespace troupe::data
