// A training loop written by hand on troupe's KVStore, as MXNet users wrote theirs on mx.kv:
// softmax regression on Fashion-MNIST (the IDX files of Debian's dataset-fashion-mnist), its
// weights and bias held in the store under keys 0 and 1. Each step pulls them, computes the
// gradient of the batch's mean cross-entropy here, and pushes it; the store's SGD updates.
//
//   kvstore_softmax [--kvstore local] [--epochs 1] [--batch 64] [--lr 0.1]
//                   [--data /usr/share/datasets/fashion-mnist]
//
// Prints each epoch's training loss and test accuracy. Every troupe call answers with a Status;
// the first that fails ends the program with its message.
#include <troupe/kvstore.h>
#include <troupe/version.h>
#include <zlib.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <numeric>
#include <random>
#include <string>
#include <vector>

namespace {

constexpr int kPixels = 28 * 28;
constexpr int kClasses = 10;

[[noreturn]] void fail(const std::string& message) {
  std::fprintf(stderr, "kvstore_softmax: %s\n", message.c_str());
  std::exit(1);
}

void check(const troupe::Status& s) {
  if (!s) fail(s.message());
}

// The whole of a gzip'ed file.
std::vector<unsigned char> gunzip(const std::string& path) {
  gzFile f = gzopen(path.c_str(), "rb");
  if (!f) fail("cannot open " + path);
  std::vector<unsigned char> out;
  unsigned char buf[1 << 16];
  int n = 0;
  while ((n = gzread(f, buf, sizeof buf)) > 0)
    out.insert(out.end(), buf, buf + n);
  gzclose(f);
  if (n < 0) fail("cannot read " + path);
  return out;
}

std::uint32_t bigEndian(const std::vector<unsigned char>& b, std::size_t at) {
  return (std::uint32_t{b[at]} << 24) | (std::uint32_t{b[at + 1]} << 16) |
         (std::uint32_t{b[at + 2]} << 8) | b[at + 3];
}

struct Set {
  std::vector<float> images;  // n x 784, scaled to [0, 1]
  std::vector<int> labels;
  int size() const { return static_cast<int>(labels.size()); }
};

Set load(const std::string& dir, const std::string& prefix) {
  const auto images = gunzip(dir + "/" + prefix + "-images-idx3-ubyte.gz");
  const auto labels = gunzip(dir + "/" + prefix + "-labels-idx1-ubyte.gz");
  if (images.size() < 16 || bigEndian(images, 0) != 2051 || labels.size() < 8 ||
      bigEndian(labels, 0) != 2049) {
    fail("not Fashion-MNIST IDX files in " + dir);
  }
  const std::uint32_t n = bigEndian(images, 4);
  if (bigEndian(labels, 4) != n || images.size() != 16 + std::size_t{n} * kPixels ||
      labels.size() != 8 + std::size_t{n}) {
    fail("truncated IDX files in " + dir);
  }
  Set s;
  s.images.resize(std::size_t{n} * kPixels);
  for (std::size_t i = 0; i < s.images.size(); ++i)
    s.images[i] = images[16 + i] / 255.0f;
  s.labels.assign(labels.begin() + 8, labels.end());
  return s;
}

// Class scores of one image, softmax in place.
void softmax(const float* x, const std::vector<float>& w, const std::vector<float>& b, float* p) {
  float top = -1e30f;
  for (int c = 0; c < kClasses; ++c) {
    float z = b[c];
    const float* row = &w[static_cast<std::size_t>(c) * kPixels];
    for (int j = 0; j < kPixels; ++j)
      z += row[j] * x[j];
    p[c] = z;
    top = std::max(top, z);
  }
  float sum = 0;
  for (int c = 0; c < kClasses; ++c)
    sum += p[c] = std::exp(p[c] - top);
  for (int c = 0; c < kClasses; ++c)
    p[c] /= sum;
}

}  // namespace

int main(int argc, char** argv) {
  std::string type = "local", data = "/usr/share/datasets/fashion-mnist";
  int epochs = 1, batch = 64;
  float lr = 0.1f;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i], value = argv[i + 1];
    if (flag == "--kvstore")
      type = value;
    else if (flag == "--epochs")
      epochs = std::atoi(value.c_str());
    else if (flag == "--batch")
      batch = std::atoi(value.c_str());
    else if (flag == "--lr")
      lr = std::strtof(value.c_str(), nullptr);
    else if (flag == "--data")
      data = value;
    else
      fail("unknown flag " + flag);
  }
  if (epochs < 1 || batch < 1 || !(lr > 0)) fail("--epochs, --batch and --lr must be positive");
  const Set train = load(data, "train"), test = load(data, "t10k");

  auto created = troupe::KVStore::create(type);
  if (!created) fail(created.status().message());
  troupe::KVStore& kv = *created.value();
  std::vector<float> w(static_cast<std::size_t>(kClasses) * kPixels, 0.0f), b(kClasses, 0.0f);
  check(kv.init(0, w));
  check(kv.init(1, b));
  troupe::OptimizerSpec sgd;
  sgd.learning_rate = lr;
  sgd.momentum = 0.9f;
  sgd.rescale_grad = 1.0f / static_cast<float>(batch);  // the pushes are sums over the batch
  check(kv.setOptimizer(sgd));
  std::printf("%s; kvstore %s, rank %d of %d\n", troupe::buildSummary().c_str(), kv.type().c_str(),
              kv.rank(), kv.numWorkers());

  std::vector<int> order(static_cast<std::size_t>(train.size()));
  std::iota(order.begin(), order.end(), 0);
  std::mt19937 random(1);
  std::vector<float> gw(w.size()), gb(b.size()), p(kClasses);
  for (int epoch = 1; epoch <= epochs; ++epoch) {
    std::shuffle(order.begin(), order.end(), random);
    double loss = 0;
    for (int start = 0; start + batch <= train.size(); start += batch) {
      check(kv.pull(0, w));
      check(kv.pull(1, b));
      std::fill(gw.begin(), gw.end(), 0.0f);
      std::fill(gb.begin(), gb.end(), 0.0f);
      for (int i = start; i < start + batch; ++i) {
        const int n = order[static_cast<std::size_t>(i)];
        const float* x = &train.images[static_cast<std::size_t>(n) * kPixels];
        softmax(x, w, b, p.data());
        const int y = train.labels[static_cast<std::size_t>(n)];
        loss -= std::log(std::max(p[y], 1e-12f));
        for (int c = 0; c < kClasses; ++c) {
          const float d = p[c] - (c == y ? 1.0f : 0.0f);  // d loss / d score
          gb[c] += d;
          float* row = &gw[static_cast<std::size_t>(c) * kPixels];
          for (int j = 0; j < kPixels; ++j)
            row[j] += d * x[j];
        }
      }
      check(kv.push(0, gw));
      check(kv.push(1, gb));
    }
    check(kv.pull(0, w));
    check(kv.pull(1, b));
    int correct = 0;
    for (int n = 0; n < test.size(); ++n) {
      softmax(&test.images[static_cast<std::size_t>(n) * kPixels], w, b, p.data());
      correct += std::max_element(p.begin(), p.end()) - p.begin() == test.labels[n];
    }
    const int steps = train.size() / batch;
    std::printf("epoch %d: train loss %.4f, test accuracy %.4f\n", epoch,
                loss / (static_cast<double>(steps) * batch),
                static_cast<double>(correct) / test.size());
  }
  check(kv.barrier());
  return 0;
}
