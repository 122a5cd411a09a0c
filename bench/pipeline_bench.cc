// Pipeline stages (NetOptions::pipeline) on the CPU: a training step's time for each
// number of stages K and micro-batches M, against the whole net on the same threads, and the
// bubble: the share of the stages' time spent waiting, 1 - (sum of the stages' compute) /
// (K * step), beside GPipe's (K - 1) / (M + K - 1) for balanced stages with free transfers.
// Each stage is a thread with threads / K of the backend's (at least 1); above the machine's cores
// the stages share them and the measured bubble counts that too.
//
//   troupe_pipeline_bench [--model gpt2|lenet|mlp] [--stages 2,4] [--micro 1,2,4,8]
//                         [--batch 8] [--threads 2] [--seconds 3]
//                         [--seq 128] [--n-layer 8] [--n-head 4] [--n-embd 256] [--vocab 512]
// gpt2: a GPT-2 of those shapes on random tokens; the rows count tokens/s. Prints a Markdown table.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "kernels/backend.h"
#include "kernels/net.h"
#include "kernels/random.h"

using namespace troupe::kernels;

namespace {

using Clock = std::chrono::steady_clock;

struct Args {
  std::string model = "gpt2";
  std::vector<int> stages{2, 4}, micro{1, 2, 4, 8};
  std::int64_t batch = 8, seq = 128, n_layer = 8, n_head = 4, n_embd = 256;
  int vocab = 512, threads = 2;
  double seconds = 3;
};

std::vector<int> listOf(const std::string& text) {
  std::vector<int> out;
  std::stringstream in(text);
  for (std::string item; std::getline(in, item, ',');)
    out.push_back(std::atoi(item.c_str()));
  return out;
}

NetOptions optionsOf(const Args& a) {
  NetOptions o;
  o.model.name = a.model;
  o.max_batch = a.batch;
  if (a.model == "gpt2") {
    o.sequence_length = a.seq;
    o.num_labels = a.vocab;
    o.gpt = {a.n_layer, a.n_head, a.n_embd};
  }
  return o;
}

struct Batch {
  Tensor inputs, labels;
};

Batch batchOf(const Args& a) {
  if (a.model == "gpt2") {
    Batch b{Tensor::host({a.batch, a.seq}, DType::kInt32),
            Tensor::host({a.batch, a.seq}, DType::kInt32)};
    for (std::int64_t i = 0; i < a.batch * a.seq; ++i) {
      b.inputs.i32()[i] = static_cast<int>(randomBits(1, 0, i) % static_cast<unsigned>(a.vocab));
      b.labels.i32()[i] = static_cast<int>(randomBits(1, 1, i) % static_cast<unsigned>(a.vocab));
    }
    return b;
  }
  Batch b{Tensor::host({a.batch, 1, 28, 28}), Tensor::host({a.batch}, DType::kInt32)};
  for (std::int64_t i = 0; i < b.inputs.numel(); ++i)
    b.inputs.f32()[i] = uniform01(randomBits(2, 0, i));
  for (std::int64_t i = 0; i < a.batch; ++i)
    b.labels.i32()[i] = static_cast<int>(i % 10);
  return b;
}

struct Measured {
  double step = 0;                   // seconds
  std::vector<double> busy;          // each stage's compute a step, seconds
  std::vector<std::int64_t> memory;  // bytes each stage's copies hold (or the net's)
};

Measured measure(const Args& a, int stages, int micro, int threads) {
  auto backend = makeCpuBackend(threads);
  NetOptions o = optionsOf(a);
  o.pipeline.stages = stages;
  o.pipeline.micro_batches = stages > 1 ? micro : 0;
  auto net = makeNet(*backend, o);
  const Batch b = batchOf(a);
  auto step = [&] { net->trainStep(b.inputs, b.labels, 1.0f, nullptr); };
  step();
  step();
  int steps = 0;
  const auto start = Clock::now();
  double elapsed = 0;
  while (elapsed < a.seconds || steps < 3) {
    step();
    ++steps;
    elapsed = std::chrono::duration<double>(Clock::now() - start).count();
  }
  Measured m;
  m.step = elapsed / steps;
  m.memory.push_back(net->memory().held);
  if (stages > 1) {
    net->setProfiling(true);
    const auto from = Clock::now();
    for (int i = 0; i < 3; ++i)
      step();
    m.step = std::chrono::duration<double>(Clock::now() - from).count() / 3;
    const StepProfile p = net->profile();
    net->setProfiling(false);
    for (const auto& row : p.rows)
      if (row.kind.rfind("pipeline stage ", 0) == 0)
        m.busy.push_back((row.forward + row.backward) / static_cast<double>(p.steps));
  }
  return m;
}

}  // namespace

int main(int argc, char** argv) {
  Args a;
  auto integer = [](std::int64_t& to) {
    return [&to](const std::string& v) { to = std::atoll(v.c_str()); };
  };
  const std::map<std::string, std::function<void(const std::string&)>> flags{
      {"--model", [&](const std::string& v) { a.model = v; }},
      {"--stages", [&](const std::string& v) { a.stages = listOf(v); }},
      {"--micro", [&](const std::string& v) { a.micro = listOf(v); }},
      {"--threads", [&](const std::string& v) { a.threads = std::atoi(v.c_str()); }},
      {"--vocab", [&](const std::string& v) { a.vocab = std::atoi(v.c_str()); }},
      {"--seconds", [&](const std::string& v) { a.seconds = std::atof(v.c_str()); }},
      {"--batch", integer(a.batch)},
      {"--seq", integer(a.seq)},
      {"--n-layer", integer(a.n_layer)},
      {"--n-head", integer(a.n_head)},
      {"--n-embd", integer(a.n_embd)}};
  for (int i = 1; i < argc; i += 2) {
    const auto flag = flags.find(argv[i]);
    if (flag == flags.end() || i + 1 >= argc) {
      std::fprintf(stderr, "%s: %s\n", argv[i],
                   flag == flags.end() ? "unknown argument" : "needs a value");
      return 2;
    }
    flag->second(argv[i + 1]);
  }
  const double per_step =
      a.model == "gpt2" ? static_cast<double>(a.batch * a.seq) : static_cast<double>(a.batch);
  const char* unit = a.model == "gpt2" ? "tokens/s" : "samples/s";
  try {
    const Measured whole = measure(a, 1, 0, a.threads);
    std::printf("%s, batch %lld, %d threads\n\n", a.model.c_str(), static_cast<long long>(a.batch),
                a.threads);
    std::printf(
        "| stages | micro-batches | step ms | %s | vs whole | stages' compute ms | "
        "bubble | (K-1)/(M+K-1) | bytes held |\n",
        unit);
    std::printf("|---|---|---|---|---|---|---|---|---|\n");
    std::printf("| 1 | - | %.2f | %.0f | 1.00 | - | - | - | %lld |\n", whole.step * 1e3,
                per_step / whole.step, static_cast<long long>(whole.memory[0]));
    for (int k : a.stages) {
      for (int m : a.micro) {
        if (m > a.batch) continue;
        const Measured p = measure(a, k, m, a.threads);
        double busy = 0;
        std::string each;
        for (double s : p.busy) {
          busy += s;
          each += (each.empty() ? "" : ", ") + std::to_string(s * 1e3).substr(0, 6);
        }
        const double bubble = 1 - busy / (k * p.step);
        std::printf("| %d | %d | %.2f | %.0f | %.2f | %s | %.3f | %.3f | %lld |\n", k, m,
                    p.step * 1e3, per_step / p.step, whole.step / p.step, each.c_str(), bubble,
                    static_cast<double>(k - 1) / (m + k - 1), static_cast<long long>(p.memory[0]));
        std::fflush(stdout);
      }
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  }
  return 0;
}
