#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <random>
#include <thread>
#include <vector>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include "actors/run/checkpoint.h"
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
    ck.state = kernels::Tensor::host({5});
    for (int i = 0; i < 5; ++i) {
      ck.weights.f32()[i] = 0.5f * static_cast<float>(i);
      ck.state.f32()[i] = -1.0f * static_cast<float>(i);
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
  EXPECT_EQ(ck.state.f32()[3], -3.0f);
  EXPECT_EQ(ck.buffers.numel(), 0);
}

TEST_F(CheckpointTest, AMetaValueThatIsNotANumberIsAnInputErrorNamingTheKey) {
  auto ck = sample();
  ck.meta["step"] = "forty";
  ck.meta["cumulative_time_spent"] = "1.5s";
  saveCheckpoint(path("a.ckpt"), ck);
  const auto loaded = loadCheckpoint(path("a.ckpt"));
  try {
    loaded.metaInt("step");
    ADD_FAILURE() << "metaInt accepted 'forty'";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("'step' is 'forty', not an integer"), std::string::npos)
        << e.what();
  }
  EXPECT_THROW(loaded.metaDouble("cumulative_time_spent"), InputError);
  EXPECT_THROW(loaded.metaInt("model"), InputError);
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

TEST_F(CheckpointTest, MetaAloneIsReadFromTheHead) {
  saveCheckpoint(path("a.ckpt"), sample());
  const auto meta = loadCheckpointMeta(path("a.ckpt"));
  EXPECT_EQ(meta.at("step"), "40");
  EXPECT_EQ(meta.at("model"), "lenet");
  std::ofstream(path("b.ckpt")) << "not one";
  EXPECT_THROW(loadCheckpointMeta(path("b.ckpt")), InputError);
}

// The pid of a process that has ended and been reaped.
pid_t deadPid() {
  const pid_t child = ::fork();
  if (child == 0) ::_exit(0);
  ::waitpid(child, nullptr, 0);
  return child;
}

TEST_F(CheckpointTest, StaleTemporariesOfDeadWritersAreRemovedAndNothingElse) {
  saveCheckpoint(path("a.ckpt"), sample());
  const std::string dead = path("b.ckpt.tmp.") + std::to_string(deadPid());
  const std::string alive = path("c.ckpt.tmp.") + std::to_string(::getpid());
  const std::string other = path("notes.tmp.1");
  for (const auto& p : {dead, alive, other})
    std::ofstream(p) << "half a checkpoint";
  const auto removed = removeStaleTemporaries(dir_.string());
  ASSERT_EQ(removed.size(), 1u);
  EXPECT_EQ(removed[0], dead);
  EXPECT_FALSE(fs::exists(dead));
  EXPECT_TRUE(fs::exists(alive)) << "a live writer's save is left alone";
  EXPECT_TRUE(fs::exists(other)) << "not a checkpoint's temporary";
  EXPECT_NO_THROW(loadCheckpoint(path("a.ckpt")));
  EXPECT_TRUE(removeStaleTemporaries((dir_ / "missing").string()).empty());
}

TEST_F(CheckpointTest, TheLatestIsTheHighestCompleteAcceptedStep) {
  auto save = [&](const char* name, int step, const char* run) {
    auto ck = sample();
    ck.meta["step"] = std::to_string(step);
    ck.meta["run_id"] = run;
    saveCheckpoint(path(name), ck);
  };
  save("a.ckpt", 10, "r1");
  save("b.ckpt", 30, "r1");
  save("c.ckpt", 20, "r1");
  save("d.ckpt", 40, "r2");
  // b, the highest of r1, is corrupt: a byte of its weights flipped.
  {
    std::fstream f(path("b.ckpt"), std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(-8, std::ios::end);
    f.put('\x7f');
  }
  // A save of step 50 that never finished.
  std::ofstream(path("e.ckpt.tmp.") + std::to_string(deadPid())) << "TROUPECK";
  auto ofRun = [](const char* run) {
    return [run](const std::map<std::string, std::string>& meta) -> std::string {
      return meta.at("run_id") == run ? "" : "another run";
    };
  };
  const auto found = findLatestCheckpoint(dir_.string(), ofRun("r1"));
  ASSERT_TRUE(found.has_value());
  EXPECT_EQ(found->path, path("c.ckpt"));
  EXPECT_EQ(found->checkpoint.metaInt("step"), 20);
  EXPECT_EQ(found->checkpoint.weights.numel(), 5);
  EXPECT_EQ(findLatestCheckpoint(dir_.string(), ofRun("r2"))->path, path("d.ckpt"));
  EXPECT_FALSE(findLatestCheckpoint(dir_.string(), ofRun("r3")).has_value());
  EXPECT_FALSE(findLatestCheckpoint((dir_ / "missing").string(), ofRun("r1")).has_value());
}

TEST_F(CheckpointTest, OfTwoProcessesSavingOneNameAtOnceExactlyOneSucceeds) {
  // Both writers are released together by one pipe, so both pass any "does it exist?" check
  // before either publishes; only a no-replace publish lets exactly one win, every round.
  for (int round = 0; round < 8; ++round) {
    const std::string target = path(("race" + std::to_string(round) + ".ckpt").c_str());
    int go[2];
    ASSERT_EQ(::pipe(go), 0);
    pid_t writers[2];
    for (int w = 0; w < 2; ++w) {
      writers[w] = ::fork();
      ASSERT_GE(writers[w], 0);
      if (writers[w] == 0) {
        ::close(go[1]);
        char byte;
        if (::read(go[0], &byte, 1) != 1) ::_exit(4);
        Checkpoint ck = sample();
        ck.meta["writer"] = std::to_string(w);
        try {
          saveCheckpoint(target, ck);
        } catch (const IoError&) {
          ::_exit(3);
        }
        ::_exit(0);
      }
    }
    ::close(go[0]);
    ASSERT_EQ(::write(go[1], "gg", 2), 2);
    ::close(go[1]);
    int succeeded = -1, wins = 0;
    for (int w = 0; w < 2; ++w) {
      int status = 0;
      ASSERT_EQ(::waitpid(writers[w], &status, 0), writers[w]);
      ASSERT_TRUE(WIFEXITED(status));
      const int code = WEXITSTATUS(status);
      ASSERT_TRUE(code == 0 || code == 3) << "writer " << w << " exited " << code;
      if (code == 0) {
        succeeded = w;
        ++wins;
      }
    }
    ASSERT_EQ(wins, 1) << "round " << round << ": both writers reported success";
    EXPECT_EQ(loadCheckpoint(target).meta.at("writer"), std::to_string(succeeded))
        << "the file on disk is the winner's";
  }
}

TEST_F(CheckpointTest, ANonFiniteValueIsNeverSaved) {
  for (const float bad :
       {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity()}) {
    Checkpoint ck = sample();
    ck.state.f32()[3] = bad;
    try {
      saveCheckpoint(path("diverged.ckpt"), ck);
      FAIL() << "a checkpoint holding " << bad << " was written";
    } catch (const NumericError& e) {
      EXPECT_NE(std::string(e.what()).find("optimizer state"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("index 3"), std::string::npos) << e.what();
    }
    EXPECT_FALSE(fs::exists(path("diverged.ckpt")));
    EXPECT_TRUE(fs::is_empty(dir_)) << "no temporary left behind";
  }
}

// A sharded state (ZeRO's) put together on disk: AdamW's 2 rows of 1000 columns in the shards [0,
// 300) and [300, 1000), each written in pieces of 7 elements that cross its rows' ends, out of
// order. The checkpoint written from the file holds the state as one tensor would; the file goes
// with its StateFile; a non-finite value in it is refused as a tensor's is, naming its index.
TEST_F(CheckpointTest, AStatePutTogetherOnDiskFromShardsIsSavedAsTheWholeState) {
  constexpr std::int64_t kRows = 2, kColumns = 1000;
  const std::pair<std::int64_t, std::int64_t> shards[] = {{300, 1000}, {0, 300}};
  auto whole = kernels::Tensor::host({kRows * kColumns});
  for (std::int64_t i = 0; i < whole.numel(); ++i)
    whole.f32()[i] = static_cast<float>(i) * 0.25f - 100.0f;
  Checkpoint ck = sample();
  ck.meta["optimizer"] = "adamw";
  ck.meta["optimizer_state"] = "exp_avg,exp_avg_sq";
  ck.weights = kernels::Tensor::host({kColumns});
  ck.state = kernels::Tensor();
  {
    StateFile file(path("state.ckpt.tmp.1"), kRows, kColumns);
    for (const auto& [begin, end] : shards) {
      // The shard as its worker holds it: each row's columns [begin, end), one row after another.
      const std::int64_t width = end - begin;
      std::vector<float> shard;
      for (std::int64_t r = 0; r < kRows; ++r)
        for (std::int64_t c = begin; c < end; ++c)
          shard.push_back(whole.f32()[r * kColumns + c]);
      for (std::int64_t at = 0; at < kRows * width; at += 7) {
        const std::int64_t n = std::min<std::int64_t>(7, kRows * width - at);
        file.write(begin, end, at, shard.data() + at, n);
      }
    }
    ck.state_file = file.path();
    saveCheckpoint(path("sharded.ckpt"), ck);
    ck.meta["step"] = "41";
    float nan = std::numeric_limits<float>::quiet_NaN();
    file.write(300, 1000, 700 + 5, &nan, 1);  // row 1, column 305: element 1305 of the state
    try {
      saveCheckpoint(path("diverged.ckpt"), ck);
      FAIL() << "a state file holding NaN was written";
    } catch (const NumericError& e) {
      EXPECT_NE(std::string(e.what()).find("index 1305 of 2000"), std::string::npos) << e.what();
    }
    EXPECT_FALSE(fs::exists(path("diverged.ckpt")));
  }
  EXPECT_FALSE(fs::exists(path("state.ckpt.tmp.1"))) << "the state's file goes with its StateFile";
  const auto loaded = loadCheckpoint(path("sharded.ckpt"));
  ASSERT_EQ(loaded.state.numel(), whole.numel());
  EXPECT_EQ(std::memcmp(loaded.state.f32(), whole.f32(), 4 * kRows * kColumns), 0);
  EXPECT_EQ(loaded.stateNames(), (std::vector<std::string>{"exp_avg", "exp_avg_sq"}));
  EXPECT_EQ(loaded.metaInt("step"), 40);

  // A worker's shard read back alone: columns [300, 1000) of each row, one row after another.
  const auto shard =
      loadCheckpoint(path("sharded.ckpt"), std::pair<std::int64_t, std::int64_t>{300, 1000});
  ASSERT_EQ(shard.state.numel(), kRows * 700);
  for (std::int64_t r = 0; r < kRows; ++r) {
    for (std::int64_t c = 300; c < 1000; ++c) {
      ASSERT_EQ(shard.state.f32()[r * 700 + c - 300], whole.f32()[r * kColumns + c])
          << "row " << r << ", column " << c;
    }
  }
  EXPECT_EQ(shard.weights.numel(), kColumns);
  // The whole file's checksum is checked all the same: a byte flipped in a column not read. The
  // file ends with the state's 2000 floats, the buffers' count (8 bytes, none) and the CRC (4):
  // row 0's column 5 is 4 + 8 + 8000 - 20 bytes before the end.
  {
    std::fstream f(path("sharded.ckpt"), std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(-(4 + 8 + 8000 - 20), std::ios::end);
    f.put('\x7f');
  }
  EXPECT_THROW(
      loadCheckpoint(path("sharded.ckpt"), std::pair<std::int64_t, std::int64_t>{300, 1000}),
      InputError);
}

}  // namespace
}  // namespace troupe::actors

namespace troupe::actors {
namespace {

// A process killed with SIGKILL at a random moment of saving never leaves a torn checkpoint: every
// *.ckpt in the folder loads (temporary files may stay behind; they are never loaded).
// Pipeline stages' workers: the weights put together on disk from each stage's range, a piece at
// a time, are saved as the whole model's, and a non-finite one among them is refused as the
// weights'.
TEST_F(CheckpointTest, WeightsPutTogetherOnDiskFromStagesAreSavedAsTheWholeModels) {
  constexpr std::int64_t kParams = 1000;
  const std::vector<std::pair<std::int64_t, std::int64_t>> stages = {{0, 300}, {300, 1000}};
  Checkpoint ck = sample();
  ck.state = kernels::Tensor::host({kParams});
  std::fill(ck.state.f32(), ck.state.f32() + kParams, 1.0f);
  ck.weights = kernels::Tensor();
  std::vector<float> whole(kParams);
  for (std::int64_t i = 0; i < kParams; ++i)
    whole[static_cast<std::size_t>(i)] = static_cast<float>(i) * 0.5f - 3.0f;
  {
    StateFile file(path("weights.ckpt.tmp.1"), 1, kParams);
    for (auto it = stages.rbegin(); it != stages.rend(); ++it) {  // any order
      const auto [begin, end] = *it;
      for (std::int64_t at = 0; at < end - begin; at += 64) {
        const std::int64_t n = std::min<std::int64_t>(64, end - begin - at);
        file.write(begin, end, at, whole.data() + begin + at, n);
      }
    }
    ck.weights_file = file.path();
    saveCheckpoint(path("staged.ckpt"), ck);
    const float inf = std::numeric_limits<float>::infinity();
    file.write(300, 1000, 7, &inf, 1);
    try {
      saveCheckpoint(path("diverged.ckpt"), ck);
      FAIL() << "a weights file holding inf was written";
    } catch (const NumericError& e) {
      EXPECT_NE(std::string(e.what()).find("its weights hold a non-finite value (inf at index 307"),
                std::string::npos)
          << e.what();
    }
  }
  const auto loaded = loadCheckpoint(path("staged.ckpt"));
  ASSERT_EQ(loaded.weights.numel(), kParams);
  EXPECT_EQ(std::memcmp(loaded.weights.f32(), whole.data(), 4 * kParams), 0);
  EXPECT_EQ(loaded.state.numel(), kParams);
}

TEST(CheckpointCrash, SigkillDuringSavesNeverLeavesAnUnloadableCheckpoint) {
  const fs::path dir =
      fs::temp_directory_path() / ("troupe_ckpt_kill_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  Checkpoint big;
  big.weights = kernels::Tensor::host({1 << 20});  // 4 MiB, so a kill often lands mid-write
  big.state = kernels::Tensor::host({1 << 20});
  big.buffers = kernels::Tensor::host({0});
  std::mt19937 rng(42);
  int saved_before_kill = 0, killed_mid_write = 0;
  for (int round = 0; round < 15; ++round) {
    const pid_t child = ::fork();
    ASSERT_GE(child, 0);
    if (child == 0) {
      for (int i = 0;; ++i) {
        big.meta["step"] = std::to_string(i);
        saveCheckpoint(
            (dir / ("r" + std::to_string(round) + "_" + std::to_string(i) + ".ckpt")).string(),
            big);
      }
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5 + rng() % 200));
    ::kill(child, SIGKILL);
    int status = 0;
    ::waitpid(child, &status, 0);
    ASSERT_TRUE(WIFSIGNALED(status));
    for (const auto& e : fs::directory_iterator(dir)) {
      if (e.path().string().find(".ckpt.tmp.") != std::string::npos) ++killed_mid_write;
      if (e.path().extension() != ".ckpt") continue;
      EXPECT_NO_THROW(loadCheckpoint(e.path().string())) << e.path();
      ++saved_before_kill;
    }
  }
  EXPECT_GT(saved_before_kill, 0) << "no save ever completed: the test proved nothing";
  EXPECT_GT(killed_mid_write, 0) << "no kill landed during a write: the test proved nothing";
  fs::remove_all(dir);
}

}  // namespace
}  // namespace troupe::actors
