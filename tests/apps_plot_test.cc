// `troupe plot`: round ticks, and the SVG and PNG it draws from training logs (written here by
// hand); the PNG is read back with cairo and its pixels counted by colour, so that a run missing
// from the drawing, or drawn in another run's colour, fails.
#include <cairo.h>
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <string>

#include "apps/log_report.h"
#include "apps/plot.h"
#include "cli_util.h"
#include "troupe/error.h"

namespace troupe::apps {
namespace {

using testing::runCommand;
using testing::slurp;
using testing::TempDir;
using testing::troupeBinary;

constexpr const char* kHead =
    "time_spent,cumulative_time_spent,input_count,cumulative_input_count,cumulative_batch_count,"
    "inputs_per_sec,accuracy,epoch,learning_rate,loss,test_accuracy\n";

// Three epochs of a run; `slower` scales its time and loss, so that two runs' lines part.
std::string logText(const std::string& id, const std::string& test2, double slower = 1) {
  std::string s = "# " + id + " model=lenet batch_size=64 schedule=local num_shards=1\n" + kHead;
  const double loss[] = {1.25, 0.5, 0.4}, acc[] = {0.5, 0.75, 0.8}, speed[] = {500, 667, 800};
  const std::string test[] = {"0.60", test2, "0.70"};
  double total = 0;
  for (int e = 0; e < 3; ++e) {
    const double t = 2.0 * slower;
    total += t;
    s += std::to_string(t) + "," + std::to_string(total) + ",1000," +
         std::to_string(1000 * (e + 1)) + ",16," + std::to_string(speed[e] / slower) + "," +
         std::to_string(acc[e] / slower) + "," + std::to_string(e + 1) + ",0.01," +
         std::to_string(loss[e] * slower) + "," + test[e] + "\n";
  }
  return s;
}

// Pixels of `png` within 12/255 of the colour (r, g, b) in every channel.
long pixelsOf(const std::string& png, double r, double g, double b) {
  cairo_surface_t* s = cairo_image_surface_create_from_png(png.c_str());
  EXPECT_EQ(cairo_surface_status(s), CAIRO_STATUS_SUCCESS) << png;
  const int w = cairo_image_surface_get_width(s), h = cairo_image_surface_get_height(s);
  const int stride = cairo_image_surface_get_stride(s);
  const unsigned char* data = cairo_image_surface_get_data(s);
  long n = 0;
  for (int y = 0; y < h; ++y) {
    for (int x = 0; x < w; ++x) {
      const auto* p = data + y * stride + 4 * x;  // ARGB32, native endian: B G R A
      auto near = [](unsigned char c, double v) { return std::abs(c - v * 255) <= 12; };
      n += near(p[2], r) && near(p[1], g) && near(p[0], b);
    }
  }
  cairo_surface_destroy(s);
  return n;
}

class PlotTest : public ::testing::Test {
 protected:
  std::string write(const std::string& name, const std::string& text) {
    const std::string path = dir_.str() + "/" + name;
    std::ofstream(path) << text;
    return path;
  }
  TempDir dir_{"plot"};
};

TEST(NiceTicks, CoverTheRangeInStepsOfOneTwoOrFiveTimesAPowerOfTen) {
  for (const auto& [lo, hi] : {std::pair{0.0, 0.95},
                               {0.74, 0.93},
                               {8287.0, 13138.0},
                               {0.0, 25.3},
                               {-3.0, 7.0},
                               {1e-4, 3e-4}}) {
    const auto t = niceTicks(lo, hi, 5);
    ASSERT_GE(t.size(), 3u) << lo << " " << hi;
    EXPECT_LE(t.front(), lo);
    EXPECT_GE(t.back(), hi);
    const double step = t[1] - t[0];
    const double mantissa = step / std::pow(10.0, std::floor(std::log10(step)));
    EXPECT_TRUE(std::abs(mantissa - 1) < 1e-9 || std::abs(mantissa - 2) < 1e-9 ||
                std::abs(mantissa - 5) < 1e-9)
        << step;
    EXPECT_LE(t.size(), 12u) << "too many ticks for " << lo << ".." << hi;
  }
}

// Two runs: the first in tab10's blue, the second in its orange; a test accuracy the first run
// lacks in epoch 2 (-1) breaks its line without failing.
TEST_F(PlotTest, APngShowsEachRunInItsOwnColourAtTheSizeAsked) {
  const auto a = readTrainLog(write("a.log", logText("run_a", "-1")));
  const auto b = readTrainLog(write("b.log", logText("run_b", "0.65", 1.3)));
  PlotOptions o;
  o.output = dir_.str() + "/two.png";
  o.width = 900;
  o.height = 700;
  plotLogs({a, b}, {"a", "b"}, o);
  const std::string png = slurp(o.output);
  ASSERT_GT(png.size(), 24u);
  EXPECT_EQ(png.substr(1, 3), "PNG");
  // IHDR: width and height, big-endian, at bytes 16..23.
  auto be32 = [&](std::size_t at) {
    return (static_cast<unsigned char>(png[at]) << 24) |
           (static_cast<unsigned char>(png[at + 1]) << 16) |
           (static_cast<unsigned char>(png[at + 2]) << 8) | static_cast<unsigned char>(png[at + 3]);
  };
  EXPECT_EQ(be32(16), 900u);
  EXPECT_EQ(be32(20), 700u);
  const long blue = pixelsOf(o.output, 0.12, 0.47, 0.71);
  const long orange = pixelsOf(o.output, 1.00, 0.50, 0.05);
  EXPECT_GT(blue, 500) << "the first run's lines";
  EXPECT_GT(orange, 500) << "the second run's lines";

  o.output = dir_.str() + "/one.png";
  plotLogs({a}, {"a"}, o);
  EXPECT_GT(pixelsOf(o.output, 0.12, 0.47, 0.71), 500);
  EXPECT_EQ(pixelsOf(o.output, 1.00, 0.50, 0.05), 0) << "one run has no second colour";
}

TEST_F(PlotTest, AnSvgIsWrittenWithTheSizeAsked) {
  const auto a = readTrainLog(write("a.log", logText("run_a", "0.65")));
  PlotOptions o;
  o.output = dir_.str() + "/a.svg";
  plotLogs({a}, {"a"}, o);
  const std::string svg = slurp(o.output);
  EXPECT_NE(svg.find("<svg"), std::string::npos);
  EXPECT_NE(svg.find("width=\"1200pt\" height=\"960pt\""), std::string::npos) << svg.substr(0, 300);
}

TEST_F(PlotTest, BadRequestsAreOneErrorNamingTheCulprit) {
  const auto a = readTrainLog(write("a.log", logText("run_a", "0.65")));
  auto error = [&](const std::vector<TrainLogFile>& logs, const std::string& out) {
    PlotOptions o;
    o.output = out;
    try {
      std::vector<std::string> labels(logs.size(), "x");
      plotLogs(logs, labels, o);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_EQ(
      error({a}, dir_.str() + "/a.jpg"),
      "-o " + dir_.str() + "/a.jpg: the plot is written as .svg or .png (by the name's ending)");
  EXPECT_NE(
      error({a}, "/proc/no/such/dir/a.png").find("cannot write the plot '/proc/no/such/dir/a.png'"),
      std::string::npos);
  const auto empty = readTrainLog(write("empty.log", "# run_e model=lenet\n" + std::string(kHead)));
  EXPECT_EQ(error({empty}, dir_.str() + "/e.png"), "'" + empty.path + "' has no epochs to plot");
}

TEST_F(PlotTest, TheCommandPlotsLogsWithTheirLabelsAndRefusesAMismatchedLabelCount) {
  const auto a = write("a.log", logText("run_a", "0.65"));
  const auto b = write("b.log", logText("run_b", "0.66", 1.3));
  const std::string out = dir_.str() + "/cli.png";
  auto r = runCommand(troupeBinary() + " plot " + a + " " + b + " -o " + out +
                      " --label first --label second --size 800x600");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find(out + ": 2 run(s), 6 epoch(s) in all"), std::string::npos) << r.output;
  EXPECT_GT(pixelsOf(out, 1.00, 0.50, 0.05), 300);
  r = runCommand(troupeBinary() + " plot " + a + " " + b + " -o " + out + " --label first");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.output.find("1 --label for 2 logs: give one per log, or none"), std::string::npos)
      << r.output;
  r = runCommand(troupeBinary() + " plot " + a + " -o " + out + " --size 10x10");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.output.find("--size 10x10: expected WIDTHxHEIGHT"), std::string::npos) << r.output;
}

}  // namespace
}  // namespace troupe::apps
