#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "actors/checkpoint.h"
#include "troupe/error.h"

namespace troupe::actors {
namespace {

namespace fs = std::filesystem;

class CheckpointTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("troupe_ckpt_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  static Checkpoint sample() {
    Checkpoint ck;
    ck.meta["step"] = "40";
    ck.meta["model"] = "lenet";
    ck.weights = kernels::Tensor::host({5});
    ck.momentum = kernels::Tensor::host({5});
    for (int i = 0; i < 5; ++i) {
      ck.weights.f32()[i] = 0.5f * static_cast<float>(i);
      ck.momentum.f32()[i] = -1.0f * static_cast<float>(i);
    }
    ck.buffers = kernels::Tensor::host({0});
    return ck;
  }
  std::string path(const char* name) const { return (dir_ / name).string(); }

  fs::path dir_;
};

TEST_F(CheckpointTest, RoundTripsEveryField) {
  saveCheckpoint(path("a.ckpt"), sample());
  const auto ck = loadCheckpoint(path("a.ckpt"));
  EXPECT_EQ(ck.metaInt("step"), 40);
  EXPECT_EQ(ck.meta.at("model"), "lenet");
  ASSERT_EQ(ck.weights.numel(), 5);
  EXPECT_EQ(ck.weights.f32()[4], 2.0f);
  EXPECT_EQ(ck.momentum.f32()[3], -3.0f);
  EXPECT_EQ(ck.buffers.numel(), 0);
}

TEST_F(CheckpointTest, LeavesNoTemporaryFileBehind) {
  saveCheckpoint(path("a.ckpt"), sample());
  int files = 0;
  for (const auto& e : fs::directory_iterator(dir_)) {
    (void)e;
    ++files;
  }
  EXPECT_EQ(files, 1);
}

TEST_F(CheckpointTest, RefusesToReplaceAnExistingFile) {
  saveCheckpoint(path("a.ckpt"), sample());
  EXPECT_THROW(saveCheckpoint(path("a.ckpt"), sample()), IoError);
  EXPECT_NO_THROW(loadCheckpoint(path("a.ckpt")));
}

TEST_F(CheckpointTest, EveryTruncationIsRefusedWithTheFileNamed) {
  saveCheckpoint(path("a.ckpt"), sample());
  const auto size = fs::file_size(path("a.ckpt"));
  for (std::uintmax_t cut = 0; cut < size; cut += 7) {
    fs::copy_file(path("a.ckpt"), path("b.ckpt"), fs::copy_options::overwrite_existing);
    fs::resize_file(path("b.ckpt"), cut);
    try {
      loadCheckpoint(path("b.ckpt"));
      FAIL() << "a checkpoint cut to " << cut << " bytes loaded";
    } catch (const InputError& e) {
      EXPECT_NE(std::string(e.what()).find("b.ckpt"), std::string::npos) << e.what();
    }
  }
}

TEST_F(CheckpointTest, AFlippedByteIsCaughtByTheChecksum) {
  saveCheckpoint(path("a.ckpt"), sample());
  const auto size = fs::file_size(path("a.ckpt"));
  for (std::uintmax_t at = 0; at < size; ++at) {
    fs::copy_file(path("a.ckpt"), path("b.ckpt"), fs::copy_options::overwrite_existing);
    std::fstream f(path("b.ckpt"), std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(static_cast<std::streamoff>(at));
    char c;
    f.get(c);
    f.seekp(static_cast<std::streamoff>(at));
    f.put(static_cast<char>(c ^ 0x5a));
    f.close();
    EXPECT_THROW(loadCheckpoint(path("b.ckpt")), InputError) << "byte " << at;
  }
}

TEST_F(CheckpointTest, AMissingFileIsAnInputErrorNamingIt) {
  try {
    loadCheckpoint(path("missing.ckpt"));
    FAIL();
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("missing.ckpt"), std::string::npos);
  }
}

TEST_F(CheckpointTest, AnUnwritableFolderIsAnIoError) {
  EXPECT_THROW(saveCheckpoint("/proc/troupe-no/a.ckpt", sample()), IoError);
}

}  // namespace
}  // namespace troupe::actors
