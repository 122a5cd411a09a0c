// GPT-2 (model "gpt2", kernels/net.cc's buildGpt): its shape and names against nanoGPT's and
// llm.c's, its gradients against finite differences, and 20 training steps against PyTorch
// (tests/gpt_reference.py, run with Debian's python3-torch) with the loss of each step within a
// first-order rounding bound that the reference derives at that step's weights.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "kernels/backend.h"
#include "kernels/net.h"
#include "language_model_util.h"
#include "troupe/error.h"

namespace troupe::kernels {
namespace {

using testing::errorOf;
using testing::randomSequences;
using testing::Sequences;

NetOptions gpt(std::int64_t n_layer, std::int64_t n_head, std::int64_t n_embd,
               std::int64_t block_size, int vocab, std::int64_t batch) {
  NetOptions o = testing::languageModel("gpt2", block_size, vocab, batch);
  o.gpt = {n_layer, n_head, n_embd};
  return o;
}

// llm.c's train_gpt2 prints "num_parameters: 124439808" for d12 (vocabulary 50257, context
// 1024), nanoGPT counts the same with the tied output layer counted once.
TEST(Gpt, D12HasGpt2SmallsParameterCountAndNanoGptsNames) {
  auto backend = makeCpuBackend(1);
  auto net = makeNet(*backend, gpt(12, 12, 768, 1024, 50257, 1));
  EXPECT_EQ(net->numParams(), 124439808);
  // MFU's model FLOPs (PaLM's count, as nanoGPT's estimate_mfu): 6 a token for each weight of a
  // product (each block's four matrices and the tied output layer), and 12 L C T a token for
  // attention; over a sequence of T = 1024.
  const double t = 1024, block = 768.0 * 2304 + 768 * 768 + 768 * 3072 + 3072 * 768;
  EXPECT_DOUBLE_EQ(net->trainingFlopsPerSample(),
                   t * (6 * (12 * block + 768.0 * 50257) + 12 * 12 * 768 * t));
  const auto& p = net->params();
  ASSERT_EQ(p.size(), 2u + 12 * 12 + 2);
  EXPECT_EQ(p[0].name, "transformer.wte.weight");
  EXPECT_EQ(p[0].shape, (Shape{50257, 768}));
  EXPECT_EQ(p[1].name, "transformer.wpe.weight");
  EXPECT_EQ(p[4].name, "transformer.h.0.attn.c_attn.weight");
  EXPECT_EQ(p[4].shape, (Shape{3 * 768, 768}));
  EXPECT_EQ(p[12].name, "transformer.h.0.mlp.c_proj.weight");
  EXPECT_EQ(p[12].shape, (Shape{768, 4 * 768}));
  EXPECT_EQ(p.back().name, "transformer.ln_f.bias");
  // Weight decay as llm.c's: the embeddings and the matrices, not the biases and layer norms.
  EXPECT_TRUE(p[0].decays);
  EXPECT_TRUE(p[4].decays);
  EXPECT_FALSE(p[5].decays);
  EXPECT_FALSE(p[2].decays);
  // GPT-2's initialisation: N(0, 0.02^2), the residual projections' scaled by 1/sqrt(2 n_layer).
  const float* w = net->weights().f32();
  auto stddev = [&](const ParamInfo& info) {
    double s = 0;
    for (std::int64_t i = 0; i < info.size; ++i)
      s += double(w[info.offset + i]) * w[info.offset + i];
    return std::sqrt(s / static_cast<double>(info.size));
  };
  // A sample standard deviation of m >= 589,824 draws is within 3 / sqrt(2 m) < 0.3% relative
  // of sigma with probability above 0.997; 1% leaves room.
  EXPECT_NEAR(stddev(p[4]), 0.02, 0.02 * 0.01);
  EXPECT_NEAR(stddev(p[12]), 0.02 / std::sqrt(24.0), 0.02 / std::sqrt(24.0) * 0.01);
}

TEST(Gpt, BadShapesAreRefusedNamingTheKey) {
  EXPECT_EQ(errorOf(gpt(2, 3, 16, 8, 40, 1)),
            "n_embd = 16 is not a positive multiple of n_head = 3");
  EXPECT_EQ(errorOf(gpt(0, 2, 16, 8, 40, 1)), "n_layer = 0 (at least 1)");
  NetOptions images = gpt(2, 2, 16, 8, 40, 1);
  images.sequence_length = 0;
  EXPECT_EQ(errorOf(images),
            "model gpt2 reads token sequences: set block_size (the tokens a sequence holds)");
  NetOptions lenet = gpt(2, 2, 16, 8, 40, 1);
  lenet.model.name = "lenet";
  EXPECT_EQ(errorOf(lenet), "model lenet reads images, not token sequences");
}

TEST(Gpt, ReadyRangesCoverEveryParameterOnceWithTheTiedEmbeddingLast) {
  auto backend = makeCpuBackend(2);
  auto net = makeNet(*backend, gpt(2, 2, 16, 8, 40, 3));
  const Sequences s = randomSequences(3, 8, 40, 1);
  net->forward(s.tokens, s.labels, true);
  std::vector<std::pair<std::int64_t, std::int64_t>> ranges;
  net->backward(1.0f, [&](std::int64_t begin, std::int64_t end, const Event*) {
    ranges.emplace_back(begin, end);
  });
  ASSERT_FALSE(ranges.empty());
  EXPECT_EQ(ranges.front().second, net->numParams());
  EXPECT_EQ(ranges.back(), (std::pair<std::int64_t, std::int64_t>{0, (40 + 8) * 16}));
  for (std::size_t i = 1; i < ranges.size(); ++i)
    EXPECT_EQ(ranges[i].second, ranges[i - 1].first) << "range " << i;
}

// Two elements of every parameter tensor against one-sided differences of the loss
// (one_sided_differences.h). The loss is smooth (no kinks), so L' is monotone on the interval
// unless L'' changes sign inside; the wte elements reached through both the embedding and the
// output layer check the tied gradient's two parts.
TEST(Gpt, GradientsMatchFiniteDifferences) {
  auto backend = makeCpuBackend(1);
  auto net = makeNet(*backend, gpt(2, 2, 16, 8, 40, 3));
  const Sequences s = randomSequences(3, 8, 40, 2);
  const auto [agree, checked] = testing::checkAgainstOneSidedDifferences(*net, s, 2);
  // The loss has no kinks, so all agree but where L'' turns inside an interval (none of the 56
  // here); one is allowed for that. A missing half of the tied embedding's gradient fails both
  // of wte's, a wrong layer's gradient most of its own.
  EXPECT_GE(agree, checked - 1) << "of " << checked;
}

// 20 steps of SGD (lr 0.1) on one batch: before each step troupe's weights go to the reference,
// which computes the loss at them in float64 with its bound; troupe's loss of that step must be
// within twice the bound (the second-order terms the bound leaves out are below (roundings on a
// path x u) ~ 1e3 x 2^-24 < 1e-4 of it).
TEST(Gpt, TwentyStepsLossesEqualPyTorchsWithinTheRoundingBound) {
  const std::int64_t layers = 2, heads = 2, embd = 32, t = 16, n = 4, steps = 20;
  const int vocab = 64;
  const float lr = 0.1f;
  auto backend = makeCpuBackend(2);
  auto net = makeNet(*backend, gpt(layers, heads, embd, t, vocab, n));
  const Sequences s = randomSequences(n, t, vocab, 3);
  const testing::ReferenceSteps r =
      testing::runReferenceSteps(*backend, *net, s.tokens, s.labels, vocab, steps, lr, "TROUPEGPT1",
                                 {layers, heads, embd}, "gpt_reference.py");
  ASSERT_EQ(r.error, "");
  testing::expectWithinTwiceTheBound(r);
  EXPECT_LT(r.losses.back(), r.losses.front() - 0.5) << "the loss barely fell";
}

}  // namespace
}  // namespace troupe::kernels
