// `troupe bench input` end to end: a database of JPEG records made by `troupe convert images
// --encoded`, read through the training transform by the bench at two decode_threads values.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "cli_util.h"
#include "data/image.h"
#include "data_test_util.h"

namespace troupe {
namespace {

namespace fs = std::filesystem;
using ::testing::AllOf;
using ::testing::HasSubstr;
using testing::runCommand;
using testing::troupeBinary;

// 12 JPEGs of 40x30 and 30x44 pixels, labels 0..2, in dir/root, listed in dir/list.txt; then
// converted into dir/db.
void makeJpegDb(const fs::path& dir) {
  fs::create_directories(dir / "root");
  std::ofstream list(dir / "list.txt");
  for (int i = 0; i < 12; ++i) {
    data::Image image;
    image.height = i % 2 ? 30 : 44;
    image.width = i % 2 ? 40 : 30;
    image.channels = 3;
    const std::string pixels =
        data::testing::pattern(static_cast<std::size_t>(image.height) * image.width * 3, i);
    image.pixels.assign(pixels.begin(), pixels.end());
    const std::string name = "img" + std::to_string(i) + ".jpg";
    std::ofstream(dir / "root" / name, std::ios::binary) << data::encodeJpeg(image);
    list << name << " " << i % 3 << "\n";
  }
  list.close();
  const auto r =
      runCommand(troupeBinary() + " convert images '" + (dir / "list.txt").string() + "' '" +
                 (dir / "root").string() + "' --encoded --out '" + (dir / "db").string() + "'");
  ASSERT_EQ(r.exit_code, 0) << r.output;
}

// The table's data rows, split on '|'.
std::vector<std::vector<std::string>> tableRows(const std::string& output) {
  std::vector<std::vector<std::string>> rows;
  std::istringstream in(output);
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("| ", 0) != 0 || line.find("decode_threads") != std::string::npos) continue;
    std::vector<std::string> cells;
    std::istringstream parts(line.substr(1));
    for (std::string cell; std::getline(parts, cell, '|');)
      cells.push_back(cell);
    rows.push_back(cells);
  }
  return rows;
}

TEST(BenchInput, OneRowPerDecodeThreadsValueWithTheTrainingTransform) {
  data::testing::TempDir dir;
  makeJpegDb(dir.str());
  const auto r =
      runCommand(troupeBinary() + " bench input --train_data '" + dir / "db" +
                 "' --num_channels 3 --crop 24 --random_resized_crop --mirror --batch_size 5 "
                 "--batches 3 --warmup 1 --sweep 1,2");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_THAT(r.output, AllOf(HasSubstr("(12 records)"), HasSubstr("random-resized crop"),
                              HasSubstr("to 24x24"), HasSubstr("mirror"), HasSubstr("batch 5")));
  const auto rows = tableRows(r.output);
  ASSERT_EQ(rows.size(), 2u) << r.output;
  for (std::size_t i = 0; i < rows.size(); ++i) {
    ASSERT_EQ(rows[i].size(), 4u) << r.output;
    EXPECT_EQ(std::stoi(rows[i][0]), static_cast<int>(i) + 1);
    const double rate = std::stod(rows[i][1]), per_thread = std::stod(rows[i][2]);
    EXPECT_GT(rate, 0.0) << r.output;
    EXPECT_NEAR(per_thread * static_cast<double>(i + 1), rate, 0.1 * (i + 1)) << r.output;
    // 15 images in 3 batches: ms per batch = 1000 * 15 / rate / 3, to the table's rounding.
    EXPECT_NEAR(std::stod(rows[i][3]), 5e3 / rate, 0.01 + 1e-3 * 5e3 / rate) << r.output;
  }
}

TEST(BenchInput, BadSettingsAreNamed) {
  data::testing::TempDir dir;
  makeJpegDb(dir.str());
  // A crop larger than the images is the record's error, with its key.
  auto r = runCommand(troupeBinary() + " bench input --train_data '" + dir / "db" +
                      "' --num_channels 3 --crop 64 --batch_size 2 --batches 1");
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_THAT(r.output, AllOf(HasSubstr("img"), HasSubstr("smaller than the crop 64x64")));
  r = runCommand(troupeBinary() + " bench input --train_data '" + dir / "db" +
                 "' --num_channels 3 --crop 24 --sweep 0");
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_THAT(r.output, HasSubstr("--sweep: 0"));
  r = runCommand(troupeBinary() + " bench input --num_channels 3 --crop 24");
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_THAT(r.output, HasSubstr("train_data"));
}

}  // namespace
}  // namespace troupe
