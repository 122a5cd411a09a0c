// `troupe bench input [CONFIG] [--key value ...] [--sweep 1,2]`: how many images a second one
// reader decodes and transforms from the run's training data, with the run's own settings (every
// train key, the transform's included), at each decode_threads asked. What a reader does, without
// the training: batches of batch_size records in the epoch's order (the seed's), read by the
// dataset with decode_threads threads into float tensors (bytes under input_dtype uint8). A few
// untimed batches first (the database's pages, the threads, the buffers), then the timed ones.
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <CLI/CLI.hpp>

#include <chrono>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "actors/run/run_plan.h"
#include "apps/commands.h"
#include "apps/config.h"
#include "data/dataset.h"
#include "troupe/error.h"

namespace troupe::apps {
namespace {

struct InputBenchArgs {
  std::string config;
  actors::ConfigOverrides overrides;
  std::vector<int> threads;  // empty: the config's decode_threads
  int batches = 50;
  int warmup = 5;
};

std::string describeTransform(const data::ImageTransformOptions& t, int size, bool uint8) {
  std::vector<std::string> parts;
  if (t.random_resized_crop) {
    parts.push_back(
        fmt::format("random-resized crop (area {:g}-{:g}, aspect {:.3g}-{:.3g}) to {}x{}",
                    t.min_area, t.max_area, t.min_aspect, t.max_aspect, size, size));
  } else if (t.crop > 0) {
    parts.push_back(t.resize_short > 0 ? fmt::format("short side to {}, random {}x{} crop",
                                                     t.resize_short, size, size)
                                       : fmt::format("random {}x{} crop", size, size));
  } else {
    parts.push_back(fmt::format("{}x{} records as they are", size, size));
  }
  if (t.mirror) parts.push_back("mirror");
  if (t.brightness > 0 || t.contrast > 0 || t.saturation > 0) {
    parts.push_back(
        fmt::format("colour jitter {:g}/{:g}/{:g}", t.brightness, t.contrast, t.saturation));
  }
  parts.push_back(uint8 ? "uint8 NCHW (input_dtype uint8: normalised on the replica)"
                        : "normalised fp32 NCHW");
  return fmt::format("{}", fmt::join(parts, ", "));
}

struct Timing {
  double seconds = 0;
  std::int64_t images = 0;
};

Timing measure(data::DatasetOptions options, int threads, const InputBenchArgs& a,
               std::int64_t batch) {
  options.decode_threads = threads;
  auto dataset = data::openDataset(options);
  const std::int64_t n = dataset->size();
  const auto values =
      static_cast<std::size_t>(batch * options.channels * options.height * options.width);
  std::vector<float> images(options.uint8 ? 0 : values);
  std::vector<std::uint8_t> bytes(options.uint8 ? values : 0);
  std::vector<std::int32_t> labels(static_cast<std::size_t>(batch));
  std::vector<std::int64_t> indices(static_cast<std::size_t>(batch));
  std::vector<std::int64_t> order;
  std::int64_t epoch = -1, at = 0;
  auto next = [&] {
    for (auto& index : indices) {
      if (at % n == 0 && at / n != epoch) {
        epoch = at / n;
        order = data::epochOrder(n, options.seed, epoch);
      }
      index = order[static_cast<std::size_t>(at++ % n)];
    }
    if (options.uint8) {
      dataset->read(indices, epoch, bytes.data(), labels.data());
    } else {
      dataset->read(indices, epoch, images.data(), labels.data());
    }
  };
  for (int b = 0; b < a.warmup; ++b)
    next();
  const auto start = std::chrono::steady_clock::now();
  for (int b = 0; b < a.batches; ++b)
    next();
  Timing t;
  t.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  t.images = batch * a.batches;
  return t;
}

void run(const InputBenchArgs& a) {
  if (a.batches < 1 || a.warmup < 0) {
    throw InputError("--batches must be at least 1 and --warmup at least 0");
  }
  const auto o = actors::loadTrainOptions(a.config, a.overrides);
  if (o.train_data.empty()) throw InputError("no training data: set train_data");
  const data::DatasetOptions options = actors::datasetOptions(o, o.train_data, true);
  std::vector<int> threads = a.threads;
  if (threads.empty()) threads.push_back(o.decode_threads);
  for (const int t : threads) {
    if (t < 1 || t > 1024) throw InputError(fmt::format("--sweep: {} is not within 1..1024", t));
  }
  const std::int64_t batch = o.batch_size;
  const auto size = data::openDataset(options)->size();
  fmt::print(
      "# troupe input: {} ({} records), {} channels, {}; batch {}, {} untimed + {} timed "
      "batches in the seed's epoch order\n",
      o.train_data, size, o.num_channels,
      describeTransform(o.transform, o.image_size, options.uint8), batch, a.warmup, a.batches);
  fmt::print("| decode_threads | images/s | images/s per thread | ms per batch |\n");
  fmt::print("|---|---|---|---|\n");
  std::fflush(stdout);
  for (const int t : threads) {
    const Timing timing = measure(options, t, a, batch);
    const double rate = static_cast<double>(timing.images) / timing.seconds;
    fmt::print("| {} | {:.1f} | {:.1f} | {:.2f} |\n", t, rate, rate / t,
               1e3 * timing.seconds / a.batches);
    std::fflush(stdout);
  }
}

}  // namespace

void addInputBenchCommand(CLI::App& bench) {
  auto args = std::make_shared<InputBenchArgs>();
  auto* cmd = bench.add_subcommand(
      "input",
      "Images/s one reader decodes and transforms from train_data, with the run's settings");
  cmd->add_option("config", args->config, "TOML config file (optional)");
  addConfigOptions(*cmd, &args->overrides);
  cmd->add_option("--sweep", args->threads,
                  "decode_threads values to measure, one row each (default: the config's)")
      ->delimiter(',');
  cmd->add_option("--batches", args->batches, "timed batches per row")->capture_default_str();
  cmd->add_option("--warmup", args->warmup, "untimed batches first")->capture_default_str();
  cmd->callback([args] { run(*args); });
}

}  // namespace troupe::apps
