// A training loop written by hand on troupe's KVStore, as MXNet users wrote theirs on mx.kv:
// softmax regression on Fashion-MNIST (the IDX files of Debian's dataset-fashion-mnist), its
// weights and bias held in the store under keys 0 and 1. Each step pulls them, computes the
// gradient of the batch's cross-entropy here, and pushes it; the store's SGD updates.
//
//   kvstore_softmax [--kvstore local] [--epochs 1] [--batch 64] [--lr 0.02]
//                   [--data /usr/share/datasets/fashion-mnist]
//
// With a distributed store it is MXNet's dist_sync example in C++: each worker trains on its part
// of the training set (record i goes to worker i mod W) with --batch images a step, and the
// servers apply the mean gradient of the W batches:
//
//   troupe launch -n 2 -s 1 -- kvstore_softmax --kvstore dist_sync    (or dist_async, ssp)
//   troupe launch -n 2 -- kvstore_softmax --kvstore ring              (no servers)
//
// The server processes serve (KVStore::runServer) and exit. Worker 0 prints each epoch's training
// loss, test accuracy and the run's inputs/s (every worker's images over the epoch's time; the
// workers start and end each epoch together). Every troupe call answers with a Status; the first
// that fails ends the program with its message.
#include <troupe/kvstore.h>
#include <troupe/version.h>

#include "common/fashion_mnist.h"
#include "common/flags.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

namespace {

using examples::kClasses;
using examples::kPixels;
[[noreturn]] void fail(const std::string& message) {
  std::fprintf(stderr, "kvstore_softmax: %s\n", message.c_str());
  std::exit(1);
}

void check(const troupe::Status& s) {
  if (!s) fail(s.message());
}

// Softmax probabilities p[i][c] of the images x[0..n) (n <= 4), from their class scores. The
// images go together so that each weight read serves all of them.
void probabilities(const float* const* x, int n, const std::vector<float>& w,
                   const std::vector<float>& b, float* p) {
  for (int c = 0; c < kClasses; ++c) {
    const float* row = &w[static_cast<std::size_t>(c) * kPixels];
    float z0 = 0, z1 = 0, z2 = 0, z3 = 0;
    const float* x0 = x[0];
    const float* x1 = x[n > 1 ? 1 : 0];
    const float* x2 = x[n > 2 ? 2 : 0];
    const float* x3 = x[n > 3 ? 3 : 0];
#pragma omp simd reduction(+ : z0, z1, z2, z3)  // vector dot products (-fopenmp-simd)
    for (int j = 0; j < kPixels; ++j) {
      z0 += row[j] * x0[j];
      z1 += row[j] * x1[j];
      z2 += row[j] * x2[j];
      z3 += row[j] * x3[j];
    }
    const float z[4] = {z0, z1, z2, z3};
    for (int i = 0; i < n; ++i)
      p[i * kClasses + c] = z[i] + b[static_cast<std::size_t>(c)];
  }
  for (int i = 0; i < n; ++i) {
    float* pi = p + i * kClasses;
    const float top = *std::max_element(pi, pi + kClasses);
    float sum = 0;
    for (int c = 0; c < kClasses; ++c)
      sum += pi[c] = std::exp(pi[c] - top);
    for (int c = 0; c < kClasses; ++c)
      pi[c] /= sum;
  }
}

// Adds the gradients of the images x[0..n) (n <= 4) to gw and gb, given d[i][c], the derivative
// of image i's loss by its score c.
void addGradients(const float* const* x, int n, const float* d, std::vector<float>& gw,
                  std::vector<float>& gb) {
  for (int c = 0; c < kClasses; ++c) {
    float dc[4] = {};
    for (int i = 0; i < n; ++i) {
      dc[i] = d[i * kClasses + c];
      gb[static_cast<std::size_t>(c)] += dc[i];
    }
    float* row = &gw[static_cast<std::size_t>(c) * kPixels];
    const float* x0 = x[0];
    const float* x1 = x[n > 1 ? 1 : 0];
    const float* x2 = x[n > 2 ? 2 : 0];
    const float* x3 = x[n > 3 ? 3 : 0];
    for (int j = 0; j < kPixels; ++j)
      row[j] += dc[0] * x0[j] + dc[1] * x1[j] + dc[2] * x2[j] + dc[3] * x3[j];
  }
}

}  // namespace

int main(int argc, char** argv) {
  auto flags = examples::parseFlags("kvstore_softmax", argc, argv,
                                    {{"kvstore", "local"},
                                     {"epochs", "1"},
                                     {"batch", "64"},
                                     {"lr", "0.02"},
                                     {"data", examples::kFashionMnist}});
  const std::string type = flags["kvstore"], data = flags["data"];
  const int epochs = std::atoi(flags["epochs"].c_str()), batch = std::atoi(flags["batch"].c_str());
  const float lr = std::strtof(flags["lr"].c_str(), nullptr);
  if (epochs < 1 || batch < 1 || !(lr > 0)) fail("--epochs, --batch and --lr must be positive");
  if (troupe::KVStore::isServer()) {
    const troupe::Status served = troupe::KVStore::runServer(type);
    if (!served) fail(served.message());
    return 0;
  }
  examples::FashionMnist train, test;
  try {
    train = examples::loadFashionMnist(data, "train");
    test = examples::loadFashionMnist(data, "t10k");
  } catch (const std::exception& e) {
    fail(e.what());
  }

  auto created = troupe::KVStore::create(type);
  if (!created) fail(created.status().message());
  troupe::KVStore& kv = *created.value();
  std::vector<float> w(static_cast<std::size_t>(kClasses) * kPixels, 0.0f), b(kClasses, 0.0f);
  check(kv.init(0, w));
  check(kv.init(1, b));
  troupe::OptimizerSpec sgd;
  sgd.learning_rate = lr;
  sgd.momentum = 0.9f;
  // The pushes are sums over a batch; the servers add every worker's.
  sgd.rescale_grad = 1.0f / static_cast<float>(batch * kv.numWorkers());
  check(kv.setOptimizer(sgd));
  const bool chief = kv.rank() == 0;
  if (chief) {
    std::printf("%s; kvstore %s, %d worker(s)\n", troupe::buildSummary().c_str(), kv.type().c_str(),
                kv.numWorkers());
  }

  // This worker's part of the training set.
  std::vector<int> order;
  for (int n = kv.rank(); n < train.size(); n += kv.numWorkers())
    order.push_back(n);
  // Every worker takes as many steps (dist_sync sums the n-th push of each): the smallest part's.
  const int steps = train.size() / kv.numWorkers() / batch;
  std::mt19937 random(1 + static_cast<unsigned>(kv.rank()));
  std::vector<float> gw(w.size()), gb(b.size()), p(4 * kClasses);
  for (int epoch = 1; epoch <= epochs; ++epoch) {
    std::shuffle(order.begin(), order.end(), random);
    check(kv.barrier());
    const auto began = std::chrono::steady_clock::now();
    double loss = 0;
    for (int start = 0; start < steps * batch; start += batch) {
      check(kv.pull({0, 1}, {w, b}));  // both keys in one round trip
      std::fill(gw.begin(), gw.end(), 0.0f);
      std::fill(gb.begin(), gb.end(), 0.0f);
      for (int i = start; i < start + batch; i += 4) {
        const int n = std::min(4, start + batch - i);
        const float* x[4];
        for (int k = 0; k < n; ++k) {
          const int r = order[static_cast<std::size_t>(i + k)];
          x[k] = &train.images[static_cast<std::size_t>(r) * kPixels];
        }
        probabilities(x, n, w, b, p.data());
        for (int k = 0; k < n; ++k) {
          const int r = order[static_cast<std::size_t>(i + k)];
          float& py = p[static_cast<std::size_t>(k * kClasses + train.labels[r])];
          loss -= std::log(std::max(py, 1e-12f));
          py -= 1.0f;  // p becomes d loss / d score
        }
        addGradients(x, n, p.data(), gw, gb);
      }
      check(kv.push({0, 1}, {gw, gb}));
    }
    check(kv.pull({0, 1}, {w, b}));
    check(kv.barrier());
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - began).count();
    if (!chief) continue;
    int correct = 0;
    for (int i = 0; i < test.size(); i += 4) {
      const int n = std::min(4, test.size() - i);
      const float* x[4];
      for (int k = 0; k < n; ++k)
        x[k] = &test.images[static_cast<std::size_t>(i + k) * kPixels];
      probabilities(x, n, w, b, p.data());
      for (int k = 0; k < n; ++k) {
        const float* pk = &p[static_cast<std::size_t>(k) * kClasses];
        correct += std::max_element(pk, pk + kClasses) - pk == test.labels[i + k];
      }
    }
    const double images = static_cast<double>(steps) * batch;
    std::printf("epoch %d: train loss %.4f, test accuracy %.4f, inputs/s %.0f\n", epoch,
                loss / images, static_cast<double>(correct) / test.size(),
                images * kv.numWorkers() / seconds);
    std::fflush(stdout);
  }
  check(kv.barrier());
  return 0;
}
