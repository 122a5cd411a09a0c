// Pipeline stages of a net (Net::pipelineCuts, runLayers): the net cut into K stages, each a net
// of its own from the same seed that runs its run of layers, the activations passed forward and
// their gradients back, computes the whole net's loss and gradients to the bit: each layer does
// the same work on the same values. GPT-2's tied output layer sends its part of wte's gradient
// back to the embedding's stage, which adds its own to it, as the whole net's embedding does.
#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "kernels/backend.h"
#include "kernels/net.h"
#include "kernels/random.h"
#include "language_model_util.h"
#include "troupe/error.h"

namespace troupe::kernels {
namespace {

struct Batch {
  Tensor inputs, labels;
};

Batch images(std::int64_t n, std::int64_t c, std::int64_t hw) {
  Batch b{Tensor::host({n, c, hw, hw}), Tensor::host({n}, DType::kInt32)};
  for (std::int64_t i = 0; i < b.inputs.numel(); ++i)
    b.inputs.f32()[i] = 2.0f * uniform01(randomBits(7, 0, i)) - 1.0f;
  for (std::int64_t i = 0; i < n; ++i)
    b.labels.i32()[i] = static_cast<int>(i % 10);
  return b;
}

NetOptions imageModel(const std::string& name, std::int64_t batch, int c, int hw) {
  NetOptions o;
  o.model.name = name;
  o.max_batch = batch;
  o.channels = c;
  o.height = o.width = hw;
  return o;
}

std::vector<float> hostCopy(Backend& backend, const Tensor& t) {
  Tensor h = Tensor::host(t.shape(), t.dtype());
  backend.copy(t, h);
  backend.synchronize();
  return std::vector<float>(h.f32(), h.f32() + h.numel());
}

// Stage s runs layers [bounds[s], bounds[s + 1]): `stages` stages at cuts spread evenly over the
// net's cuts.
std::vector<std::size_t> boundsOf(const Net& net, int stages) {
  const auto cuts = net.pipelineCuts();
  EXPECT_GE(cuts.size() + 1, static_cast<std::size_t>(stages));
  std::vector<std::size_t> bounds{0};
  for (int s = 1; s < stages; ++s)
    bounds.push_back(cuts[static_cast<std::size_t>(s) * cuts.size() / stages].layer);
  bounds.push_back(net.layers().size());
  return bounds;
}

// The whole net and its stages, one training forward and backward each: the last stage's loss and
// top-1 count, and every gradient, to the bit.
void expectStagesAsWhole(const NetOptions& o, const Batch& batch, int stages) {
  SCOPED_TRACE(o.model.name + ", " + std::to_string(stages) + " stages");
  auto backend = makeCpuBackend(2);
  auto whole = makeNet(*backend, o);
  whole->forward(batch.inputs, batch.labels, true);
  whole->backward(1.0f, nullptr);
  const auto bounds = boundsOf(*whole, stages);
  std::vector<std::unique_ptr<Net>> nets;
  for (int s = 0; s < stages; ++s) {
    nets.push_back(makeNet(*backend, o));
    nets.back()->runLayers(bounds[s], bounds[s + 1]);
  }
  Tensor in = batch.inputs;
  for (auto& net : nets) {
    net->forward(in, batch.labels, true);
    if (net != nets.back()) in = net->output();
  }
  for (int s = stages; s-- > 0;) {
    Net& net = *nets[static_cast<std::size_t>(s)];
    if (s + 1 < stages) net.setOutputGrad(nets[static_cast<std::size_t>(s) + 1]->inputGrad());
    for (int later = s + 1; later < stages; ++later) {  // tied parts that come back to s
      Net& reader = *nets[static_cast<std::size_t>(later)];
      for (const auto& [from, to] : reader.tiedRanges()) {
        for (const auto& [begin, end] : net.gradRanges())
          if (begin <= from && to <= end) net.setTiedGrad(from, reader.grads().slice(from, to));
      }
    }
    net.backward(1.0f, nullptr);
  }
  EXPECT_EQ(hostCopy(*backend, nets.back()->metrics()), hostCopy(*backend, whole->metrics()));
  const auto want = hostCopy(*backend, whole->grads());
  std::vector<int> writers(want.size(), 0);
  for (int s = 0; s < stages; ++s) {
    const auto got = hostCopy(*backend, nets[static_cast<std::size_t>(s)]->grads());
    for (const auto& [begin, end] : nets[static_cast<std::size_t>(s)]->gradRanges()) {
      for (auto i = static_cast<std::size_t>(begin); i < static_cast<std::size_t>(end); ++i) {
        ++writers[i];
        ASSERT_EQ(std::memcmp(&got[i], &want[i], sizeof(float)), 0)
            << "stage " << s << ", gradient " << i << ": " << got[i] << ", the whole net's "
            << want[i];
      }
    }
  }
  for (std::size_t i = 0; i < writers.size(); ++i)
    ASSERT_EQ(writers[i], 1) << "gradient " << i << " written by " << writers[i] << " stages";
}

TEST(PipelineStages, LenetAndResnet20CutAnywhereComputeTheWholeNetsGradients) {
  const Batch mnist = images(3, 1, 28);
  const Batch cifar = images(2, 3, 32);
  for (int stages : {2, 4}) {
    expectStagesAsWhole(imageModel("lenet", 3, 1, 28), mnist, stages);
    expectStagesAsWhole(imageModel("resnet20", 2, 3, 32), cifar, stages);
  }
  auto backend = makeCpuBackend(1);
  const auto lenet = makeNet(*backend, imageModel("lenet", 3, 1, 28));
  expectStagesAsWhole(imageModel("lenet", 3, 1, 28), mnist,
                      static_cast<int>(lenet->pipelineCuts().size()) + 1);
}

TEST(PipelineStages, Gpt2WithItsTiedOutputLayerAndTheLstmModelWithDropout) {
  NetOptions gpt = testing::languageModel("gpt2", 8, 40, 3);
  gpt.gpt = {3, 2, 16};
  const auto tokens = testing::randomSequences(3, 8, 40, 11);
  NetOptions lstm = testing::languageModel("lstm", 6, 30, 2);
  lstm.lstm = {2, 12, 12, 0.5f, false};
  const auto words = testing::randomSequences(2, 6, 30, 12);
  for (int stages : {2, 4}) {
    expectStagesAsWhole(gpt, {tokens.tokens, tokens.labels}, stages);
    expectStagesAsWhole(lstm, {words.tokens, words.labels}, stages);
  }
}

// The cuts of ResNet-20: after the stem's convolution and its ReLU (which its batch norm
// computes: no cut between those two), after each block (whose input its shortcut reads too, so
// no cut inside one), and after the pooling and the inner product.
TEST(PipelineStages, CutsFallBetweenBlocksAndNotInsideFusedLayers) {
  auto backend = makeCpuBackend(1);
  const auto net = makeNet(*backend, imageModel("resnet20", 2, 3, 32));
  const auto layers = net->layers();
  std::vector<std::string> after, want{"conv1", "relu1"};
  for (const auto& cut : net->pipelineCuts())
    after.push_back(layers[cut.layer - 1].name);
  for (int stage = 1; stage <= 3; ++stage)
    for (int block = 1; block <= 3; ++block)
      want.push_back("stage" + std::to_string(stage) + ".block" + std::to_string(block) + ".relu2");
  want.insert(want.end(), {"avgpool", "fc"});
  EXPECT_EQ(after, want);
}

TEST(PipelineStages, WrongBoundsInputsAndAMissingTiedPartAreRefused) {
  auto backend = makeCpuBackend(1);
  NetOptions gpt = testing::languageModel("gpt2", 8, 40, 3);
  gpt.gpt = {2, 2, 16};
  auto net = makeNet(*backend, gpt);
  const auto cuts = net->pipelineCuts();
  ASSERT_FALSE(cuts.empty());
  // Inside a block: its input is read by the residual add too.
  EXPECT_THROW(net->runLayers(0, cuts[0].layer + 1), InvariantError);
  net->runLayers(cuts[0].layer, net->layers().size());
  const auto tokens = testing::randomSequences(3, 8, 40, 11);
  try {
    net->forward(tokens.tokens, tokens.labels, true);  // tokens, not activations
    ADD_FAILURE() << "tokens went into a stage that takes activations";
  } catch (const InvariantError& e) {
    EXPECT_NE(std::string(e.what()).find("the activations entering a stage are int32"),
              std::string::npos)
        << e.what();
  }
  auto first = makeNet(*backend, gpt);
  first->runLayers(0, cuts[0].layer);
  first->forward(tokens.tokens, tokens.labels, true);
  first->setOutputGrad(first->output());
  try {
    first->backward(1.0f, nullptr);
    ADD_FAILURE() << "the embedding's stage went back without the output layer's part of wte";
  } catch (const InvariantError& e) {
    EXPECT_NE(std::string(e.what()).find("before setTiedGrad() of its weights at 0"),
              std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace troupe::kernels
