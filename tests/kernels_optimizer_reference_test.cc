// Every optimizer over 100 steps on random float32 weights and gradients against its reference:
// torch.optim's SGD (Nesterov), Adam, AdamW, RMSprop and Adagrad in float64, and LARS and LAMB
// as their papers write them (tests/optimizer_reference.py, run with Debian's python3-torch).
// Each element must be within the script's running error bound of troupe's float32 computation
// (first order, Higham section 3.3), doubled for the second-order terms: those are below
// (operations per step x steps x u) ~ 1e3 x 2^-24 < 1e-4 of the first-order bound, so twice it
// holds on any machine; the bound's median is about 1e-5 of |w| after 100 steps.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "cli_util.h"
#include "kernels/backend.h"
#include "kernels/optimizer.h"

namespace troupe::kernels {
namespace {

namespace fs = std::filesystem;

struct Reference {
  std::int64_t n = 0, steps = 0;
  std::vector<float> w0, grads;  // grads: steps rows of n
  std::vector<double> weights, bound;
};

struct Case {
  std::string name;  // the test's
  std::string args;  // optimizer_reference.py's
  OptimizerSettings settings;
  float lr = 0.01f;
};

// Debian's interpreter: python3-torch and python3-numpy are its packages (scripts/setup.sh).
constexpr const char* kPython = "/usr/bin/python3";

Reference runReference(const Case& c, std::int64_t n, std::int64_t steps) {
  const fs::path out = fs::temp_directory_path() /
                       ("troupe_optref_" + std::to_string(::getpid()) + "_" + c.name + ".bin");
  const std::string command = std::string(kPython) + " " + testing::sourceDir() +
                              "/tests/optimizer_reference.py --out " + out.string() + " --n " +
                              std::to_string(n) + " --steps " + std::to_string(steps) + " " +
                              c.args;
  const auto run = testing::runCommand(command);
  EXPECT_EQ(run.exit_code, 0) << command << "\n" << run.output;
  Reference r;
  std::ifstream in(out, std::ios::binary);
  char magic[10] = {};
  in.read(magic, sizeof magic);
  if (!in || std::memcmp(magic, "TROUPEOPT1", sizeof magic) != 0) {
    ADD_FAILURE() << "no reference from: " << command << "\n" << run.output;
    return r;
  }
  in.read(reinterpret_cast<char*>(&r.n), sizeof r.n);
  in.read(reinterpret_cast<char*>(&r.steps), sizeof r.steps);
  EXPECT_EQ(r.n, n);
  EXPECT_EQ(r.steps, steps);
  const auto read = [&](auto& v, std::int64_t count) {
    v.resize(static_cast<std::size_t>(count));
    in.read(reinterpret_cast<char*>(v.data()), static_cast<std::streamsize>(count * sizeof(v[0])));
  };
  read(r.w0, n);
  read(r.grads, n * steps);
  read(r.weights, n);
  read(r.bound, n);
  EXPECT_TRUE(in) << out << " is cut short";
  fs::remove(out);
  return r;
}

// troupe's weights after the reference's steps, each step applied by `apply`.
template <typename Apply>
std::vector<float> train(const Reference& r, Optimizer& opt, Backend& backend, Apply apply) {
  Tensor w = Tensor::host({r.n}), g = Tensor::host({r.n});
  std::copy(r.w0.begin(), r.w0.end(), w.f32());
  for (std::int64_t t = 1; t <= r.steps; ++t) {
    std::copy_n(r.grads.begin() + (t - 1) * r.n, r.n, g.f32());
    apply(opt, w, g, t);
    backend.synchronize();
  }
  return {w.f32(), w.f32() + r.n};
}

void expectWithinBound(const Reference& r, const std::vector<float>& got, const std::string& how) {
  int reported = 0;
  for (std::int64_t i = 0; i < r.n; ++i) {
    const double diff = std::abs(got[static_cast<std::size_t>(i)] - r.weights[i]);
    const double bound = 2 * r.bound[i];
    if (!(diff <= bound) && reported++ < 5) {
      ADD_FAILURE() << how << ": weight " << i << " is " << got[static_cast<std::size_t>(i)]
                    << ", the reference " << r.weights[i] << ": off by " << diff
                    << ", beyond the bound " << bound;
    }
  }
}

class OptimizerReference : public ::testing::TestWithParam<Case> {};

TEST_P(OptimizerReference, HundredStepsStayWithinTheRoundingBoundOfTheReference) {
  const Case& c = GetParam();
  constexpr std::int64_t kN = 1000, kSteps = 100;
  const Reference r = runReference(c, kN, kSteps);
  if (r.weights.empty()) return;
  auto backend = makeCpuBackend(2);
  auto whole = makeOptimizer(*backend, kN, c.settings);
  expectWithinBound(r,
                    train(r, *whole, *backend,
                          [&](Optimizer& o, const Tensor& w, const Tensor& g, std::int64_t t) {
                            EXPECT_TRUE(o.step(w, g, c.lr, t));
                          }),
                    c.name + ", one update of all weights");
  if (whole->layerwise()) return;  // a trust ratio needs whole layers
  // In buckets, last first as backward hands them over: an element-wise optimizer gives the same.
  auto buckets = makeOptimizer(*backend, kN, c.settings);
  expectWithinBound(
      r,
      train(r, *buckets, *backend,
            [&](Optimizer& o, const Tensor& w, const Tensor& g, std::int64_t t) {
              for (const auto& [lo, hi] :
                   {std::pair<std::int64_t, std::int64_t>{700, 1000}, {123, 700}, {0, 123}}) {
                o.stepRange(w.slice(lo, hi), g.slice(lo, hi), lo, hi, c.lr, t);
              }
              EXPECT_TRUE(o.finite());
            }),
      c.name + ", by buckets");
}

OptimizerSettings settings(const std::string& name, float weight_decay) {
  OptimizerSettings s;
  s.kind = &optimizerInfo(name);
  s.weight_decay = weight_decay;
  return s;
}

std::vector<Case> cases() {
  std::vector<Case> all;
  {
    Case c{"SgdNesterov", "--optimizer sgd --nesterov 1 --momentum 0.9 --weight-decay 0.01",
           sgdSettings(0.9f, 0.01f, true), 0.01f};
    all.push_back(c);
  }
  {
    Case c{"Adam", "--optimizer adam --weight-decay 0.01", settings("adam", 0.01f), 0.01f};
    all.push_back(c);
  }
  {
    Case c{"AdamW", "--optimizer adamw --weight-decay 0.1", settings("adamw", 0.1f), 0.01f};
    all.push_back(c);
  }
  {
    Case c{"AdamBetas", "--optimizer adam --beta1 0.5 --beta2 0.9 --epsilon 1e-6",
           settings("adam", 0.0f), 0.001f};
    c.args += " --lr 0.001";
    c.settings.beta1 = 0.5f;
    c.settings.beta2 = 0.9f;
    c.settings.epsilon = 1e-6f;
    all.push_back(c);
  }
  {
    Case c{"RmsProp", "--optimizer rmsprop --rho 0.99 --weight-decay 0.001",
           settings("rmsprop", 0.001f), 0.01f};
    c.settings.rho = 0.99f;
    all.push_back(c);
  }
  {
    Case c{"Adagrad", "--optimizer adagrad --epsilon 1e-10 --lr 0.1", settings("adagrad", 0.0f),
           0.1f};
    all.push_back(c);
  }
  // Four layers, the second (a bias, say) exempt from decay and trust ratio.
  const std::string layers = " --layers 0:300,300:310,310:900,900:1000 --no-decay 300:310";
  const std::vector<ParamRange> layer_ranges{{0, 300}, {300, 310}, {310, 900}, {900, 1000}};
  {
    Case c{"Lars",
           "--optimizer lars --momentum 0.9 --eta 0.001 --epsilon 0 --lr 0.5 "
           "--weight-decay 0.0001" +
               layers,
           settings("lars", 0.0001f), 0.5f};
    c.settings.momentum = 0.9f;
    c.settings.layers = layer_ranges;
    c.settings.no_decay = {{300, 310}};
    all.push_back(c);
  }
  {
    Case c{"Lamb", "--optimizer lamb --epsilon 1e-6 --weight-decay 0.01 --lr 0.01" + layers,
           settings("lamb", 0.01f), 0.01f};
    c.settings.layers = layer_ranges;
    c.settings.no_decay = {{300, 310}};
    all.push_back(c);
  }
  return all;
}

INSTANTIATE_TEST_SUITE_P(AllOptimizers, OptimizerReference, ::testing::ValuesIn(cases()),
                         [](const ::testing::TestParamInfo<Case>& info) {
                           return info.param.name;
                         });

}  // namespace
}  // namespace troupe::kernels
