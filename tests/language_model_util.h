// What the language models' tests share (kernels_gpt_test.cc, kernels_lstm_test.cc): random token
// batches, the InputError of a model, its gradients against one-sided differences, and training
// steps checked against a PyTorch reference script (tests/gpt_reference.py,
// tests/lstm_reference.py).
//
// The steps: troupe takes `steps` plain SGD steps on one
// batch; before each it sends its weights, and the script computes that step's loss at them in
// float64 with a first-order bound on troupe's float32 rounding, and trains on its own from the
// first weights for comparison.
//
// What the script reads (--in): the magic, the model's int64 shape values, int64 block_size,
// vocab, batch, steps, float32 lr, int64 parameter count, then per parameter int64 name length,
// name, int64 rank, int64 dims[rank] (in the flat weights' order); int32 tokens[batch *
// block_size], int32 labels[the same]; per step float32 weights[total]. What it writes (--out):
// the magic with "REF" appended, per step float64 loss and float64 bound, then per step float64
// its own training's loss.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <string>
#include <vector>

#include "cli_util.h"
#include "kernels/backend.h"
#include "kernels/net.h"
#include "kernels/random.h"
#include "one_sided_differences.h"
#include "troupe/error.h"

namespace troupe::testing {

// Built-in model `name` over sequences of `block_size` tokens of `vocab`, in batches of up to
// `batch`; its shape (NetOptions::gpt, lstm) as the caller sets it.
inline kernels::NetOptions languageModel(const std::string& name, std::int64_t block_size,
                                         int vocab, std::int64_t batch) {
  kernels::NetOptions o;
  o.model.name = name;
  o.sequence_length = block_size;
  o.num_labels = vocab;
  o.max_batch = batch;
  return o;
}

// A batch of random tokens, each labelled with a random next one (the net does not care which).
struct Sequences {
  kernels::Tensor tokens, labels;
};
inline Sequences randomSequences(std::int64_t n, std::int64_t t, int vocab, std::uint64_t seed) {
  using kernels::DType;
  using kernels::Tensor;
  Sequences s{Tensor::host({n, t}, DType::kInt32), Tensor::host({n, t}, DType::kInt32)};
  for (std::int64_t i = 0; i < n * t; ++i) {
    s.tokens.i32()[i] = static_cast<int>(kernels::randomBits(seed, 0, i) % vocab);
    s.labels.i32()[i] = static_cast<int>(kernels::randomBits(seed, 1, i) % vocab);
  }
  return s;
}

// The InputError that building the net gives, or "(no InputError)".
inline std::string errorOf(const kernels::NetOptions& o) {
  auto backend = kernels::makeCpuBackend(1);
  try {
    kernels::makeNet(*backend, o);
  } catch (const InputError& e) {
    return e.what();
  }
  return "(no InputError)";
}

// `picks` random elements of every parameter tensor against one-sided differences of the loss
// on batch s (one_sided_differences.h, eps 1e-2), printing those that disagree: {agreeing,
// checked}.
inline std::pair<int, int> checkAgainstOneSidedDifferences(kernels::Net& net, const Sequences& s,
                                                           int picks) {
  net.forward(s.tokens, s.labels, true);
  net.backward(1.0f, nullptr);
  std::vector<float> grads(net.grads().f32(), net.grads().f32() + net.numParams());
  float* w = net.weights().f32();
  auto loss = [&] {
    net.forward(s.tokens, s.labels, true);
    return static_cast<double>(net.metrics().f32()[0]);
  };
  int agree = 0, checked = 0;
  for (const auto& p : net.params()) {
    for (int pick = 0; pick < picks; ++pick) {
      const std::int64_t i =
          p.offset + static_cast<std::int64_t>(kernels::randomBits(3, p.offset, pick) % p.size);
      ++checked;
      const bool ok = withinOneSidedDifferences(w, i, grads[i], 1e-2f, loss);
      agree += ok;
      if (!ok) std::cout << p.name << "[" << i - p.offset << "]: " << grads[i] << " disagrees\n";
    }
  }
  return {agree, checked};
}

// Debian's interpreter: python3-torch and python3-numpy are its packages (scripts/setup.sh).
inline constexpr const char* kReferencePython = "/usr/bin/python3";

struct ReferenceSteps {
  std::vector<double> losses;  // troupe's, per step (mean over tokens)
  std::vector<double> want;    // the reference's at troupe's weights
  std::vector<double> bound;   // and its bound
  std::vector<double> own;     // the reference's own float64 training
  std::string error;           // why there are none: the script's failure
};

inline ReferenceSteps runReferenceSteps(kernels::Backend& backend, kernels::Net& net,
                                        const kernels::Tensor& tokens,
                                        const kernels::Tensor& labels, std::int64_t vocab,
                                        std::int64_t steps, float lr, const std::string& magic,
                                        const std::vector<std::int64_t>& shape,
                                        const std::string& script) {
  namespace fs = std::filesystem;
  const std::int64_t n = tokens.shape()[0], t = tokens.shape()[1];
  const fs::path dump =
      fs::temp_directory_path() / ("troupe_" + magic + "_" + std::to_string(::getpid()) + ".bin");
  const fs::path answer = dump.string() + ".ref";
  std::ofstream out(dump, std::ios::binary);
  auto put = [&](const void* p, std::size_t bytes) {
    out.write(static_cast<const char*>(p), static_cast<std::streamsize>(bytes));
  };
  auto putInt = [&](std::int64_t v) { put(&v, sizeof v); };
  put(magic.data(), magic.size());
  for (std::int64_t v : shape)
    putInt(v);
  for (std::int64_t v : {t, vocab, n, steps})
    putInt(v);
  put(&lr, sizeof lr);
  putInt(static_cast<std::int64_t>(net.params().size()));
  for (const auto& p : net.params()) {
    putInt(static_cast<std::int64_t>(p.name.size()));
    put(p.name.data(), p.name.size());
    putInt(static_cast<std::int64_t>(p.shape.size()));
    for (auto d : p.shape)
      putInt(d);
  }
  put(tokens.raw(), tokens.bytes());
  put(labels.raw(), labels.bytes());
  ReferenceSteps r;
  const kernels::Tensor& w = net.weights();
  for (std::int64_t step = 0; step < steps; ++step) {
    put(w.raw(), w.bytes());
    net.forward(tokens, labels, true);
    r.losses.push_back(double(net.metrics().f32()[0]) / double(n * t));
    net.backward(1.0f / static_cast<float>(n * t), nullptr);
    backend.axpy(-lr, net.grads(), w);
  }
  out.close();
  const std::string command = std::string(kReferencePython) + " " + sourceDir() + "/tests/" +
                              script + " --in " + dump.string() + " --out " + answer.string();
  const auto run = runCommand(command);
  fs::remove(dump);
  if (run.exit_code != 0) {
    r.error = command + "\n" + run.output;
    return r;
  }
  std::ifstream in(answer, std::ios::binary);
  std::string got(magic.size() + 3, '\0');
  in.read(got.data(), static_cast<std::streamsize>(got.size()));
  std::vector<double> pairs(static_cast<std::size_t>(2 * steps));
  r.own.resize(static_cast<std::size_t>(steps));
  in.read(reinterpret_cast<char*>(pairs.data()), static_cast<std::streamsize>(pairs.size() * 8));
  in.read(reinterpret_cast<char*>(r.own.data()), static_cast<std::streamsize>(r.own.size() * 8));
  fs::remove(answer);
  if (got != magic + "REF" || !in) {
    r.error = answer.string() + " is not the reference's answer, or is cut short";
    return r;
  }
  for (std::int64_t k = 0; k < steps; ++k) {
    r.want.push_back(pairs[static_cast<std::size_t>(2 * k)]);
    r.bound.push_back(pairs[static_cast<std::size_t>(2 * k + 1)]);
  }
  return r;
}

// Each step's loss within twice the reference's bound (the second-order terms the first-order
// bound leaves out are below (roundings on a path x u) ~ 1e3 x 2^-24 < 1e-4 of it), printing the
// three losses of each step.
inline void expectWithinTwiceTheBound(const ReferenceSteps& r) {
  double worst = 0;
  std::cout << std::setprecision(9);
  for (std::size_t k = 0; k < r.losses.size(); ++k) {
    EXPECT_NEAR(r.losses[k], r.want[k], 2 * r.bound[k]) << "step " << k;
    worst = std::max(worst, std::abs(r.losses[k] - r.want[k]) / r.bound[k]);
    std::cout << "step " << k << ": troupe " << r.losses[k] << ", PyTorch at its weights "
              << r.want[k] << " (bound " << r.bound[k] << "), PyTorch's own float64 training "
              << r.own[k] << "\n";
  }
  std::cout << "largest difference / bound: " << worst << "\n";
}

}  // namespace troupe::testing
