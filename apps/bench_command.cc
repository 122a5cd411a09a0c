// `troupe bench allreduce -n N --sizes 1,25,100`: troupe's ring allreduce between N local
// processes, printed as nccl-tests prints all_reduce_perf. The command launches N copies of this
// binary (apps::launch, embedded rendezvous store) with the hidden --worker flag; rank 0 hands the
// rows back through a file, and this process prints the table.
#include <fmt/format.h>
#include <spdlog/spdlog.h>
#include <unistd.h>
#include <CLI/CLI.hpp>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <random>
#include <sstream>

#include "actors/roles/roles.h"
#include "apps/allreduce_bench.h"
#include "apps/commands.h"
#include "apps/launcher.h"
#include "troupe/error.h"

namespace troupe::apps {
namespace {

struct AllreduceArgs {
  int num_workers = 2;
  AllreduceBenchOptions bench;
  double segment_mb = static_cast<double>(actors::ReducerConfig{}.segment_bytes) / 1e6;
  std::string copy = "send-buffer";
  bool worker = false;
  std::string results;  // worker: where rank 0 writes the rows
};

std::vector<std::string> workerCommand(const AllreduceArgs& a, const std::string& results) {
  std::vector<std::string> cmd = {"troupe", "bench", "allreduce", "-n",
                                  std::to_string(a.num_workers)};
  std::string sizes;
  for (double mb : a.bench.sizes_mb)
    sizes += (sizes.empty() ? "" : ",") + fmt::format("{}", mb);
  cmd.insert(cmd.end(), {"--sizes", sizes, "--iters", std::to_string(a.bench.iters), "--warmup",
                         std::to_string(a.bench.warmup), "--segment-mb",
                         fmt::format("{}", a.segment_mb), "--worker", "--results", results});
  cmd.insert(cmd.end(), {"--copy", a.copy, "--connections", std::to_string(a.bench.connections)});
  if (!a.bench.interface.empty()) cmd.insert(cmd.end(), {"--interface", a.bench.interface});
  return cmd;
}

void runWorker(const AllreduceArgs& a) {
  spdlog::set_level(spdlog::level::warn);  // the table is the output
  const auto rows = runAllreduceWorker(a.bench);
  if (std::getenv("TROUPE_RANK") != std::string("0")) return;
  std::ofstream out(a.results);
  out << encodeAllreduceRows(rows);
  if (!out.flush()) throw IoError(fmt::format("cannot write the results to {}", a.results));
}

void runLauncher(const AllreduceArgs& a) {
  if (a.num_workers < 2) throw InputError("-n: an allreduce needs at least 2 processes");
  std::random_device rd;
  const auto results = std::filesystem::temp_directory_path() /
                       fmt::format("troupe-allreduce-{}-{:08x}.txt", ::getpid(), rd());
  LaunchOptions launch_options;
  launch_options.num_workers = a.num_workers;
  launch_options.command = workerCommand(a, results.string());
  fmt::print(
      "# troupe ring allreduce (sum, float32): {} processes, segment {} MB, {} warmup + "
      "{} timed iterations, chunk copy: {}; 1 MB = 1e6 bytes\n",
      a.num_workers, a.segment_mb, a.bench.warmup, a.bench.iters, a.copy);
  std::fflush(stdout);
  const int code = launch(launch_options);
  std::string text;
  {
    std::ifstream in(results);
    std::stringstream buffer;
    buffer << in.rdbuf();
    text = buffer.str();
  }
  std::error_code ec;
  std::filesystem::remove(results, ec);
  if (code != 0) std::exit(code);
  const auto rows = decodeAllreduceRows(text);
  if (rows.size() != a.bench.sizes_mb.size()) {
    throw Error(fmt::format("allreduce bench: rank 0 reported {} of {} sizes", rows.size(),
                            a.bench.sizes_mb.size()));
  }
  fmt::print("{}", formatAllreduceTable(rows, a.num_workers));
  std::fflush(stdout);
  for (const auto& r : rows) {
    if (r.wrong != 0) {
      throw Error(fmt::format("allreduce of {} MB gave {} wrong sums", r.size_mb, r.wrong));
    }
  }
}

}  // namespace

void addBenchCommand(CLI::App& app) {
  auto* bench = app.add_subcommand("bench", "Measure troupe's communication and input");
  bench->require_subcommand(1);
  addInputBenchCommand(*bench);
  auto args = std::make_shared<AllreduceArgs>();
  auto* cmd = bench->add_subcommand(
      "allreduce", "Ring allreduce (sum, float32) between N local processes, as nccl-tests");
  cmd->add_option("-n,--num-workers", args->num_workers, "processes")->capture_default_str();
  cmd->add_option("--sizes", args->bench.sizes_mb, "buffer sizes in MB (1 MB = 1e6 bytes)")
      ->delimiter(',')
      ->capture_default_str();
  cmd->add_option("--iters", args->bench.iters, "timed allreduces per size")->capture_default_str();
  cmd->add_option("--warmup", args->bench.warmup, "untimed allreduces per size first")
      ->capture_default_str();
  cmd->add_option("--segment-mb", args->segment_mb,
                  "ring segment in MB; each message carries 1/N of it (default: the reducer's)")
      ->capture_default_str();
  cmd->add_option("--copy", args->copy,
                  "before a chunk is sent: send-buffer (copy into the transport's send buffer, "
                  "shared memory between processes of one host, as the training reducer does), "
                  "alloc (copy into a new tensor), pool (copy into a reused buffer) or none (send "
                  "the buffer itself)")
      ->check(CLI::IsMember({"send-buffer", "alloc", "pool", "none"}))
      ->capture_default_str();
  cmd->add_option("--connections", args->bench.connections,
                  "TCP connections to a process on another host (training's connections_per_peer)")
      ->check(CLI::Range(1, 16))
      ->capture_default_str();
  cmd->add_option("--interface", args->bench.interface,
                  "network interface to listen on (default: TROUPE_INTERFACE or any)");
  cmd->add_flag("--worker", args->worker, "run as one launched worker")->group("");
  cmd->add_option("--results", args->results, "worker: file for rank 0's rows")->group("");
  cmd->callback([args] {
    auto& a = *args;
    if (!(a.segment_mb > 0)) throw InputError("--segment-mb must be positive");
    a.bench.segment_bytes = std::llround(a.segment_mb * 1e6);
    using Copy = AllreduceBenchOptions::ChunkCopy;
    a.bench.copy = a.copy == "send-buffer" ? Copy::kSendBuffer
                   : a.copy == "alloc"     ? Copy::kAlloc
                   : a.copy == "pool"      ? Copy::kPool
                                           : Copy::kNone;
    if (a.worker) {
      runWorker(a);
    } else {
      runLauncher(a);
    }
  });
}

}  // namespace troupe::apps
