// The LSTM language model (model "lstm", kernels/net.cc's buildLstmLm): its parameters against
// PyTorch's word_language_model (names and counts), its refusals, its gradients against finite
// differences, and 20 training steps against torch.nn.LSTM (tests/lstm_reference.py, with
// Debian's python3-torch), the loss of each step within a first-order rounding bound that the
// reference derives at that step's weights.
#include <gtest/gtest.h>

#include <string>

#include "kernels/backend.h"
#include "kernels/net.h"
#include "language_model_util.h"
#include "troupe/error.h"

namespace troupe::kernels {
namespace {

using testing::errorOf;
using testing::randomSequences;
using testing::Sequences;

NetOptions lstm(std::int64_t nlayers, std::int64_t nhid, std::int64_t emsize, bool tied,
                std::int64_t block_size, int vocab, std::int64_t batch, float dropout = 0.0f) {
  NetOptions o = testing::languageModel("lstm", block_size, vocab, batch);
  o.lstm = {nlayers, nhid, emsize, dropout, tied};
  return o;
}

// PyTorch's RNNModel('LSTM', ntoken, 650, 650, 2) on PTB's 10,000 words: the encoder 10000 x 650,
// each layer 4 x 650 x (650 + 650) weights and 2 x 4 x 650 biases, the decoder 650 x 10000 and
// 10000; tied, the decoder's weights are the encoder's.
TEST(Lstm, MediumModelHasPyTorchsNamesAndParameterCount) {
  auto backend = makeCpuBackend(1);
  const std::int64_t layer = 4 * 650 * (650 + 650) + 2 * 4 * 650;
  auto net = makeNet(*backend, lstm(2, 650, 650, false, 35, 10000, 1));
  EXPECT_EQ(net->numParams(), 10000 * 650 + 2 * layer + 650 * 10000 + 10000);
  // MFU's model FLOPs: 6 a token for each weight of a product (the layers' and the decoder's; the
  // embedding is a lookup), over a sequence of 35.
  EXPECT_DOUBLE_EQ(net->trainingFlopsPerSample(),
                   35 * 6 * (2 * 4 * 650.0 * (650 + 650) + 650.0 * 10000));
  const auto& p = net->params();
  ASSERT_EQ(p.size(), 1u + 2 * 4 + 2);
  EXPECT_EQ(p[0].name, "encoder.weight");
  EXPECT_EQ(p[0].shape, (Shape{10000, 650}));
  EXPECT_EQ(p[1].name, "rnn.weight_ih_l0");
  EXPECT_EQ(p[1].shape, (Shape{4 * 650, 650}));
  EXPECT_EQ(p[2].name, "rnn.weight_hh_l0");
  EXPECT_EQ(p[3].name, "rnn.bias_ih_l0");
  EXPECT_EQ(p[3].shape, (Shape{4 * 650}));
  EXPECT_EQ(p[8].name, "rnn.bias_hh_l1");
  EXPECT_EQ(p[9].name, "decoder.weight");
  EXPECT_EQ(p[10].name, "decoder.bias");
  EXPECT_TRUE(p[1].decays);
  EXPECT_FALSE(p[3].decays);
  auto tied = makeNet(*backend, lstm(2, 650, 650, true, 35, 10000, 1));
  EXPECT_EQ(tied->numParams(), 10000 * 650 + 2 * layer + 10000);
  EXPECT_EQ(tied->params().back().name, "decoder.bias");
}

TEST(Lstm, BadShapesAreRefusedNamingTheKey) {
  EXPECT_EQ(errorOf(lstm(2, 32, 16, true, 8, 40, 1)),
            "tied needs emsize = nhid (the decoder reads the embedding's weights), got emsize = "
            "16, nhid = 32");
  EXPECT_EQ(errorOf(lstm(0, 32, 32, false, 8, 40, 1)), "nlayers = 0 (at least 1)");
  EXPECT_EQ(errorOf(lstm(1, 32, 32, false, 8, 40, 1, 1.0f)),
            "dropout = 1.000000 is outside [0, 1)");
  EXPECT_EQ(errorOf(lstm(1, 32, 32, false, 0, 40, 1)),
            "model lstm reads token sequences: set block_size (the tokens a sequence holds, the "
            "examples' bptt)");
}

// Two elements of every parameter tensor against one-sided differences of the loss
// (one_sided_differences.h), on a model large enough that the LSTM's two threads share its
// units. The loss is smooth, so all agree but where L'' turns inside an interval; one is allowed
// for that. The tied encoder's elements check both halves of its gradient.
TEST(Lstm, GradientsMatchFiniteDifferences) {
  auto backend = makeCpuBackend(2);
  auto net = makeNet(*backend, lstm(2, 64, 64, true, 16, 40, 4));
  const Sequences s = randomSequences(4, 16, 40, 2);
  const auto [agree, checked] = testing::checkAgainstOneSidedDifferences(*net, s, 2);
  EXPECT_GE(agree, checked - 1) << "of " << checked;
}

// 20 steps of SGD (lr 4, the loss a mean over tokens) on one batch, tied and untied, the loss
// of each within twice the reference's bound (language_model_util.h).
TEST(Lstm, TwentyStepsLossesEqualTorchNnLstmsWithinTheRoundingBound) {
  const std::int64_t layers = 2, hidden = 32, t = 12, n = 4, steps = 20;
  const int vocab = 48;
  for (const bool tied : {true, false}) {
    auto backend = makeCpuBackend(2);
    auto net = makeNet(*backend, lstm(layers, hidden, hidden, tied, t, vocab, n));
    const Sequences s = randomSequences(n, t, vocab, 3);
    const testing::ReferenceSteps r = testing::runReferenceSteps(
        *backend, *net, s.tokens, s.labels, vocab, steps, 4.0f, "TROUPELSTM1",
        {layers, hidden, hidden, tied ? 1 : 0}, "lstm_reference.py");
    ASSERT_EQ(r.error, "");
    std::cout << (tied ? "tied:\n" : "untied:\n");
    testing::expectWithinTwiceTheBound(r);
    EXPECT_LT(r.losses.back(), r.losses.front() - 0.5) << "the loss barely fell";
  }
}

}  // namespace
}  // namespace troupe::kernels
