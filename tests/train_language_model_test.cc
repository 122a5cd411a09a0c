// `troupe train --model gpt2` and `--model lstm` on token shards that `troupe convert text` wrote:
// it learns, logs its test loss per token with the perplexity, and refuses what does not fit,
// naming it.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "actors/run/checkpoint.h"
#include "cli_util.h"
#include "data/token_shards.h"

namespace troupe {
namespace {

namespace fs = std::filesystem;

using namespace testing;

const std::string kSmallGpt =
    "--model gpt2 --block_size 64 --vocab_size 256 --n_layer 2 --n_head 4 --n_embd 64 "
    "--batch_size 8 ";
// MXNet's and PyTorch's word language model, small: 2 layers of 128, tied, bptt 35, their SGD
// with gradient clipping.
const std::string kSmallLstm =
    "--model lstm --block_size 35 --vocab_size 256 --nhid 128 --emsize 128 --tied true "
    "--dropout 0.2 --batch_size 16 --clip_grad_norm 0.25 ";

// Byte-level shards of English in dir/data: lic_val_000000.bin and lic_train_000001.bin.
void convert(const TempDir& dir) {
  const auto run = convertLicenceTexts(dir.str());
  ASSERT_EQ(run.exit_code, 0) << run.output;
}

testing::CommandResult train(const TempDir& dir, const std::string& args) {
  return runCommand("cd " + dir.str() + " && " + troupeBinary() + " train " + args);
}

// `run` exited 0, and its loss fell from epoch 1 to epoch 2.
void expectTheTrainingLossFalls(const testing::CommandResult& run) {
  ASSERT_EQ(run.exit_code, 0) << run.output;
  std::smatch m;
  const std::regex epochs(R"(epoch 1 done: loss (\S+)[^]*epoch 2 done: loss (\S+))");
  ASSERT_TRUE(std::regex_search(run.output, m, epochs)) << run.output;
  EXPECT_LT(std::stod(m[2]), std::stod(m[1])) << "the loss did not fall";
}

// The cross-entropy of the validation bytes under the training bytes' frequencies (add-one
// smoothed), in nats: what a model that ignores context scores at best on them.
double unigramLoss(const std::string& data) {
  const auto train = data::readTokenShard(data + "/lic_train_000001.bin").tokens;
  const auto val = data::readTokenShard(data + "/lic_val_000000.bin").tokens;
  std::vector<double> count(256, 1.0);
  for (auto t : train)
    count[t] += 1;
  const double total = static_cast<double>(train.size()) + 256;
  double loss = 0;
  for (auto t : val)
    loss -= std::log(count[t] / total);
  return loss / static_cast<double>(val.size());
}

// A few epochs of a small model beat the byte frequencies on held-out text (3.13 nats) by a
// clear margin: it learned context (measured: the GPT after 2 epochs 2.67 nats with AdamW and
// 2.80 with SGD, the LSTM after 3 with SGD 2.44).
void expectTheLossFalls(const std::string& model, const std::string& optimizer, int epochs = 2) {
  TempDir dir("lm");
  convert(dir);
  const auto run = train(dir, model + "--train_data data --test_data data --num_epochs " +
                                  std::to_string(epochs) + " " + optimizer);
  ASSERT_EQ(run.exit_code, 0) << run.output;
  std::smatch m;
  const std::regex last_epoch(
      "epoch " + std::to_string(epochs) +
      R"( done: loss \S+ accuracy \S+ test_loss (\S+) \(perplexity (\S+)\) test_accuracy \S+ \(\d+ tokens in)");
  ASSERT_TRUE(std::regex_search(run.output, m, last_epoch)) << run.output;
  const double loss = std::stod(m[1]), perplexity = std::stod(m[2]);
  const double baseline = unigramLoss(dir.str() + "/data");
  EXPECT_LT(loss, baseline - 0.3) << "the byte frequencies alone give " << baseline;
  EXPECT_NEAR(perplexity, std::exp(loss), 0.01 * std::exp(loss));  // both rounded for the line
  // The CSV log has the test loss as a column of its own after Caffe2's (troupe plot draws it).
  std::string header, row, last;
  for (const auto& e : std::filesystem::directory_iterator(dir.path())) {
    if (e.path().extension() != ".log") continue;
    std::istringstream lines(slurp(e.path()));
    std::getline(lines, header);  // the parameters
    std::getline(lines, header);
    while (std::getline(lines, row))
      last = row;
  }
  EXPECT_TRUE(header.ends_with(",loss,test_accuracy,test_loss")) << header;
  EXPECT_NEAR(std::stod(last.substr(last.rfind(',') + 1)), loss, 1e-4) << last;
}

TEST(LanguageModel, AGptOnConvertedTextBeatsTheByteFrequenciesOnHeldOutText) {
  expectTheLossFalls(kSmallGpt, "--optimizer adamw --base_learning_rate 0.001");
}

TEST(LanguageModel, AnLstmOnConvertedTextBeatsTheByteFrequenciesOnHeldOutText) {
  expectTheLossFalls(kSmallLstm, "--optimizer sgd --momentum 0.9 --base_learning_rate 1", 3);
}

// The gradient is the mean over the batch's tokens, as PyTorch's cross_entropy over (B, T): SGD's
// learning rate means what it does there (summed over a sequence's 64 tokens instead, this run
// diverged to a loss of 1e19).
// The log_every lines give MFU: the model's training FLOPs a token (the small GPT's, 6 for each
// weight of its products plus 12 L C T: 6 (2 (3 + 1 + 4 + 4) 64^2 + 64 x 256) + 12 x 2 x 64 x 64
// = 786,432) times tokens/s over the sgemm peak the run measured and said.
TEST(LanguageModel, TheLogLinesGiveTheModelFlopsUtilisation) {
  TempDir dir("lm_mfu");
  convert(dir);
  const auto run = train(dir, kSmallGpt + "--train_data data --log_every 5 --threads 1");
  ASSERT_EQ(run.exit_code, 0) << run.output;
  std::smatch peak, line;
  ASSERT_TRUE(std::regex_search(
      run.output, peak,
      std::regex(R"(MFU: 0.7864 MFLOP a token in training, of this machine's sgemm: ([0-9.]+) )"
                 R"(GFLOP/s on 1 thread\(s\))")))
      << run.output;
  ASSERT_TRUE(std::regex_search(run.output, line,
                                std::regex(R"(step 5/\d+: .* (\d+) tokens/s MFU (\d+)%)")))
      << run.output;
  // The printed figures' rounding: the rate to a token/s, the peak to 0.05 GFLOP/s, MFU to 0.5%.
  const double rate = std::stod(line[1]), gflops = std::stod(peak[1]);
  const double mfu = 100 * rate * 786432 / (gflops * 1e9);
  const double rounding = 100 * 0.5 * 786432 / (gflops * 1e9) + mfu * 0.05 / gflops + 0.5;
  EXPECT_NEAR(std::stod(line[2]), mfu, rounding) << line[0];
  EXPECT_GT(std::stod(line[2]), 0);
}

TEST(LanguageModel, SgdStepsWithTheGradientAveragedOverTokens) {
  expectTheLossFalls(kSmallGpt, "--optimizer sgd --momentum 0.9 --base_learning_rate 0.1");
}

// A diverged run says why, as an image model's does: the tokens, integers, are not scanned as
// floats (the scan once failed on them with an error of its own).
TEST(LanguageModel, ADivergedRunSaysTheForwardPassOverflowed) {
  TempDir dir("gpt_diverged");
  convert(dir);
  const auto run = train(dir, kSmallGpt + "--train_data data --base_learning_rate 1e8");
  EXPECT_TRUE(
      failedWith(run, {"training diverged: the loss of step", "weights and inputs are finite"}));
}

// A model that does not fit max_memory in one process is refused before it starts, naming what
// it needs and the limit; within the limit it trains. The small GPT: 120,576 parameters, 0.45 MiB
// of weights, as much again for each of AdamW's 2 state rows and the gradients; its activations
// at 8 sequences of 64 tokens are a few MiB.
TEST(LanguageModel, AModelOverMaxMemoryIsRefusedBeforeItStartsNamingTheBytesAndTheLimit) {
  TempDir dir("gpt_memory");
  convert(dir);
  auto run = train(dir, kSmallGpt + "--train_data data --optimizer adamw --max_memory 1M");
  EXPECT_NE(run.exit_code, 0);
  std::smatch m;
  const std::regex refusal(
      R"(the model needs (\d+) bytes \(\S+ MiB\) in a worker, more than max_memory 1048576 )"
      R"(\(1.0 MiB\): 120576 parameters' weights 0.5 MiB, adamw's 2 state row\(s\) 0.9 MiB)");
  ASSERT_TRUE(std::regex_search(run.output, m, refusal)) << run.output;
  EXPECT_GT(std::stoll(m[1]), 4 * 4 * 120576);  // weights, gradients, 2 state rows, activations
  EXPECT_EQ(run.output.find("epoch 1"), std::string::npos) << "it started:\n" << run.output;
  run = train(dir, kSmallGpt +
                       "--train_data data --optimizer adamw --max_memory 0.5GiB "
                       "--num_epochs 1");
  EXPECT_EQ(run.exit_code, 0) << run.output;
  run = train(dir, kSmallGpt + "--train_data data --max_memory 12apples");
  EXPECT_TRUE(failedWith(run, {"'12apples' is not a count of bytes (512M, 16G, 1.5GiB)"}));
}

// A GPT of 1,661,952 parameters (n_embd 256) under max_memory 25M: in one process its weights,
// AdamW's two state rows and its gradients (6.3 + 12.7 + 6.3 MiB) and activations with their
// gradients' scratch (5.8 MiB) do not fit, and the refusal says so; with the state on parameter
// servers the worker needs 24.8 MiB (the servers' pull answers beside its weights), and each of 2
// servers holds half the keys' weights, state, pushes and pull answers (15.8 MiB): it trains, and
// each server's tensors peak within the limit, the chief's too, whose coordinator takes the
// servers' state for a checkpoint piece by piece. One server would hold all of them (31.7 MiB),
// which it refuses, naming itself. Sharded over two workers (zero_stage 1) each holds half the
// state (6.3 MiB), 24.8 MiB in all: it trains too, and each worker says its tensors peaked within
// the limit (counted at every allocation, kernels/host_memory.h), the chief too, which writes a
// checkpoint at each epoch's end: it puts the workers' shards of the state together on disk, a
// piece at a time, and never holds them all. Resumed from a checkpoint, each worker (and each
// server) reads its own columns of the state alone, and stays within the limit too. Its layers
// split over 2 or 4 pipeline stages in workers of their own train too, each worker within the
// limit.
TEST(LanguageModel, AModelWhoseStateDoesNotFitTrainsShardedOnServersOrInPipelineStageWorkers) {
  TempDir dir("lm_sharded_state");
  convert(dir);
  const std::string model =
      "--model gpt2 --block_size 64 --vocab_size 256 --n_layer 2 --n_head 4 --n_embd 256 "
      "--batch_size 2 --train_data data --optimizer adamw --base_learning_rate 0.001 "
      "--max_memory 25M --epoch_size 200 --num_epochs 2 --threads 1 --log_every 0 ";
  auto run = train(dir, model);
  EXPECT_TRUE(
      failedWith(run, {"the model needs 32620544 bytes (31.1 MiB) in a worker, more than "
                       "max_memory 26214400 (25.0 MiB): 1661952 parameters' weights 6.3 MiB, "
                       "adamw's 2 state row(s) 12.7 MiB",
                       "the optimizer's state sharded over the workers (--zero_stage 1 with "
                       "bsp-allreduce, troupe launch -n N) or held by parameter servers "
                       "(--schedule dist_sync, troupe launch -s N), the layers split over "
                       "pipeline stages in workers of their own"}));
  const auto launchAs = [&](const std::string& as, const std::string& processes,
                            const std::string& schedule) {
    return runCommand("cd " + dir.str() + " && " + troupeBinary() + " launch " + processes +
                      " -- " + troupeBinary() + " train " + as + schedule);
  };
  const auto launch = [&](const std::string& processes, const std::string& schedule) {
    return launchAs(model, processes, schedule);
  };
  run = launch("-n 2",
               "--schedule bsp-allreduce --zero_stage 1 --checkpoint_every 1 "
               "--checkpoint_dir zero");
  expectTheTrainingLossFalls(run);
  // Each of `processes` says its tensors peaked within the limit, and at `least` bytes.
  const auto expectWithinTheLimit = [](const testing::CommandResult& run,
                                       const std::vector<std::string>& processes,
                                       std::int64_t least) {
    for (const auto& process : processes) {
      std::smatch m;
      const std::regex peak(R"(\[)" + process +
                            R"(\] [^\n]*this process's tensors peaked at (\d+) bytes)");
      ASSERT_TRUE(std::regex_search(run.output, m, peak)) << run.output;
      EXPECT_LE(std::stoll(m[1]), 26214400) << process;
      EXPECT_GE(std::stoll(m[1]), least) << process;
    }
  };
  // The checkpoint of epoch 1 in `folder`.
  const auto epoch1 = [&](const char* folder) {
    for (const auto& f : fs::directory_iterator(dir.path() / folder)) {
      if (f.path().string().ends_with("_epoch1.ckpt")) return f.path().string();
    }
    return std::string("(none in ") + folder + ")";
  };
  const std::vector<std::string> workers = {"worker 0", "worker 1"};
  // Weights, half the state and gradients at least.
  const std::int64_t worker_least = 4 * 1661952 * 3;
  expectWithinTheLimit(run, workers, worker_least);
  // Resumed from epoch 1's checkpoint, each worker reads its shard of the state alone.
  run =
      launch("-n 2", "--schedule bsp-allreduce --zero_stage 1 --checkpoint_dir resumed --resume " +
                         epoch1("zero"));
  ASSERT_EQ(run.exit_code, 0) << run.output;
  EXPECT_NE(run.output.find("resuming from " + epoch1("zero") + " at step 50"), std::string::npos)
      << run.output;
  expectWithinTheLimit(run, workers, worker_least);
  // The gradients sharded too (zero_stage 2): each worker's replica writes them into two slots of
  // a bucket each (--bucket_size_mb 1; the tied embedding's bucket has memory of its own) and
  // keeps its shard's sums alone: 23.9 MiB where zero_stage 1 needs 24.8. Under 24M zero_stage 1
  // is refused, naming stage 2, which trains within the limit to the bits of the zero_stage 1
  // run's checkpoints.
  const std::string tighter =
      std::regex_replace(model, std::regex("--max_memory 25M"), "--max_memory 24M");
  const std::string slots = "--bucket_size_mb 1 --schedule bsp-allreduce --checkpoint_dir slots";
  run = launchAs(tighter, "-n 2", slots + " --zero_stage 1");
  EXPECT_TRUE(failedWith(run, {"the model needs 25972736 bytes (24.8 MiB) in a worker",
                               "the gradients' sums sharded too (--zero_stage 2) hold less"}));
  run = launchAs(tighter, "-n 2", slots + " --zero_stage 2 --checkpoint_every 1");
  expectTheTrainingLossFalls(run);
  expectWithinTheLimit(run, workers, 4 * 1661952 * 2);
  EXPECT_NE(run.output.find("estimated 25088000 bytes (23.9 MiB)"), std::string::npos)
      << run.output;
  const auto zero1 = actors::loadCheckpoint(epoch1("zero"));
  const auto zero2 = actors::loadCheckpoint(epoch1("slots"));
  ASSERT_EQ(zero1.weights.bytes(), zero2.weights.bytes());
  ASSERT_EQ(zero1.state.bytes(), zero2.state.bytes());
  EXPECT_EQ(std::memcmp(zero1.weights.raw(), zero2.weights.raw(), zero1.weights.bytes()), 0);
  EXPECT_EQ(std::memcmp(zero1.state.raw(), zero2.state.raw(), zero1.state.bytes()), 0);
  // Its layers in pipeline stages, each in a worker of its own that holds its stage's weights,
  // gradients and state alone, the chief too (a checkpoint's weights are put together on disk):
  // in 2 stages it trains, each worker within the limit (measured: 23.1 and 20.8 MiB; the chief
  // needed 29.7 while it put the whole model's weights together at each pause), writing its
  // checkpoint from the stages' workers (DistributedTraining.GptStagesInWorkers... resumes
  // one); under 22M the chief's 23.6 is refused, naming what more stages do, and 4 stages train
  // within it (measured: 11.2, 15.2, 9.5 and 15.0 MiB).
  const std::string stages =
      "--schedule bsp-allreduce --pipeline_across processes --micro_batches 2 --pipeline_stages ";
  run = launch("-n 2", stages + "2 --checkpoint_dir staged");
  expectTheTrainingLossFalls(run);
  expectWithinTheLimit(run, {"worker 0", "worker 1"}, 4 * 1661952 / 2);
  const std::string tightest =
      std::regex_replace(model, std::regex("--max_memory 25M"), "--max_memory 22M");
  run = launchAs(tightest, "-n 2", stages + "2");
  EXPECT_TRUE(failedWith(
      run, {"the model needs 24708096 bytes (23.6 MiB) in a worker, more than max_memory 23068672 "
            "(22.0 MiB): 1661952 parameters' weights 3.3 MiB (its stage's)",
            "more pipeline stages hold less each (--pipeline_stages K, troupe launch -n K)"}));
  run = launchAs(tightest, "-n 4", stages + "4");
  expectTheTrainingLossFalls(run);
  expectWithinTheLimit(run, {"worker 0", "worker 1", "worker 2", "worker 3"}, 4 * 1661952 / 4);
  run = launch("-n 1 -s 1", "--schedule dist_sync");
  EXPECT_TRUE(
      failedWith(run, {"server 0 needs 33239040 bytes (31.7 MiB) for its 1661952 keys, more "
                       "than max_memory 26214400 (25.0 MiB): weights 6.3 MiB, adamw's 2 state "
                       "row(s) 12.7 MiB, 1 push buffer(s) 6.3 MiB, 1 pull answer(s) 6.3 MiB; more "
                       "servers"}));
  run = launch("-n 1 -s 2", "--schedule dist_sync --checkpoint_every 1 --checkpoint_dir ps");
  expectTheTrainingLossFalls(run);
  // Each server holds its half of the keys only (the whole model's weights, which every process
  // plans from, are let go once its shard is copied): within the limit, as its estimate said;
  // resumed, it reads its keys' columns of the saved state alone.
  const std::vector<std::string> servers = {"server 0", "server 1"};
  const std::int64_t server_least = 4 * 1661952 / 2 * 3;  // its weights and state at least
  expectWithinTheLimit(run, servers, server_least);
  expectWithinTheLimit(run, {"worker 0"}, 4 * 1661952 * 2);  // weights and gradients at least
  run = launch("-n 1 -s 2",
               "--schedule dist_sync --checkpoint_dir ps_resumed --resume " + epoch1("ps"));
  ASSERT_EQ(run.exit_code, 0) << run.output;
  EXPECT_NE(run.output.find("resuming from " + epoch1("ps") + " at step 100"), std::string::npos)
      << run.output;
  expectWithinTheLimit(run, servers, server_least);
  expectWithinTheLimit(run, {"worker 0"}, 4 * 1661952 * 2);
}

// A GPT whose activations do not fit: 220,544 parameters (0.8 MiB of weights), but at 32
// sequences of 64 tokens its activations and their gradients are 39.5 MiB. Under max_memory 24M
// the run is refused, and the refusal offers pipeline stages; with 2 stages over 8 micro-batches
// the stages hold 8.6 MiB of activations (and the sum of their gradients, and each stage's own
// and its tied weights'), and the run trains with this process's tensors (counted at every
// allocation, kernels/host_memory.h) peaking within the estimate that admitted it (measured: 12.6
// MiB of 13.3; with a whole gradient tensor for each stage, 13.4 of 14.1; before a stage's copies
// were planned for its layers alone, 17.7 MiB of 12.8). So do the two stages as workers of their
// own, each within its own estimate (9.1 of 9.7 MiB and 5.8 of 5.9: each with its own stage's
// layers, weights and gradients alone, the chief with a copy of the whole model's weights at a
// pause; 12.2 of 13.2 and 9.6 of 10.3 with whole weights and gradients and a copy of the other
// stage's layers, for evaluation).
TEST(LanguageModel, AModelWhoseActivationsDoNotFitTrainsInPipelineStagesOverMicroBatches) {
  TempDir dir("lm_pipeline_memory");
  convert(dir);
  const std::string model =
      "--model gpt2 --block_size 64 --vocab_size 256 --n_layer 4 --n_head 4 --n_embd 64 "
      "--batch_size 32 --train_data data --base_learning_rate 0.1 --momentum 0.9 "
      "--max_memory 24M --epoch_size 640 --num_epochs 2 --log_every 0 ";
  auto run = train(dir, model);
  EXPECT_TRUE(failedWith(
      run, {"more than max_memory 25165824 (24.0 MiB): 220544 parameters' weights 0.8 MiB",
            "activations 39.5 MiB (32 inputs); pipeline stages over micro-batches "
            "(--pipeline_stages 2 --micro_batches 8) hold fewer activations at once"}));
  // Each process's peak within its estimate, and that within the limit.
  const auto expectWithinTheEstimate = [](const testing::CommandResult& run, int processes) {
    const std::regex peak(
        R"(this process's tensors peaked at (\d+) bytes \([^)]*\), estimated (\d+) bytes)");
    int seen = 0;
    for (std::sregex_iterator m(run.output.begin(), run.output.end(), peak), end; m != end;
         ++m, ++seen) {
      EXPECT_LE(std::stoll((*m)[1]), std::stoll((*m)[2])) << m->str();
      EXPECT_LE(std::stoll((*m)[2]), 25165824) << m->str();
    }
    EXPECT_EQ(seen, processes) << run.output;
  };
  run = train(dir, model + "--pipeline_stages 2 --micro_batches 8 --threads 2");
  expectTheTrainingLossFalls(run);
  expectWithinTheEstimate(run, 1);
  run = runCommand("cd " + dir.str() + " && " + troupeBinary() + " launch -n 2 -- " +
                   troupeBinary() + " train " + model +
                   "--pipeline_stages 2 --micro_batches 8 --schedule bsp-allreduce "
                   "--pipeline_across processes --threads 1");
  expectTheTrainingLossFalls(run);
  expectWithinTheEstimate(run, 2);
}

TEST(LanguageModel, AShardWithATokenOutsideTheVocabularyIsRefusedNamingIt) {
  TempDir dir("gpt_vocab");
  convert(dir);
  const auto run = train(dir,
                         "--model gpt2 --block_size 64 --vocab_size 100 --n_layer 1 "
                         "--n_head 1 --n_embd 8 --train_data data");
  EXPECT_NE(run.exit_code, 0);
  // Found in the first batch read (the shards are mapped, not scanned, when opened), named by
  // its place in its shard: the token there is the one named.
  std::smatch m;
  const std::regex refusal(
      R"(token shard 'data/lic_train_000001.bin': token (\d+) at position (\d+) is outside )"
      R"(the vocabulary \[0, 100\) \(vocab_size\))");
  ASSERT_TRUE(std::regex_search(run.output, m, refusal)) << run.output;
  const auto tokens = data::readTokenShard(dir.str() + "/data/lic_train_000001.bin").tokens;
  EXPECT_EQ(tokens.at(std::stoul(m[2])), std::stoul(m[1]));
  EXPECT_GE(std::stoul(m[1]), 100u);
  EXPECT_EQ(run.output.find("epoch 1 "), std::string::npos) << run.output;
}

TEST(LanguageModel, TheModelAndTheInputMustAgree) {
  TempDir dir("gpt_input");
  convert(dir);
  auto run = train(dir, "--model gpt2 --train_data data");
  EXPECT_TRUE(failedWith(run, {"model gpt2 reads token sequences: set block_size"}));
  run = train(dir, "--model lenet --block_size 64 --vocab_size 256 --train_data data");
  EXPECT_TRUE(failedWith(run, {"model lenet reads images, not token sequences"}));
  run = train(dir, "--model gpt2 --block_size 100000 --vocab_size 256 --train_data data");
  EXPECT_TRUE(failedWith(run, {"token shards 'data' hold 41857 tokens, fewer than block_size + 1 = "
                               "100001"}));
  run = train(dir,
              "--model gpt2 --block_size 64 --vocab_size 256 --n_embd 64 --n_head 3 "
              "--train_data data");
  EXPECT_TRUE(failedWith(run, {"n_embd = 64 is not a positive multiple of n_head = 3"}));
  run = train(dir,
              "--model lstm --block_size 35 --vocab_size 256 --nhid 100 --emsize 128 --tied true "
              "--train_data data");
  EXPECT_TRUE(failedWith(run, {"tied needs emsize = nhid (the decoder reads the embedding's "
                               "weights), got emsize = 128, nhid = 100"}));
}

}  // namespace
}  // namespace troupe
