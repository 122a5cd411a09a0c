// `troupe info`: the build and machine summary a bug report wants, as text and as JSON.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "actors/schedules/schedule.h"
#include "cli_util.h"
#include "kernels/net.h"
#include "kernels/optimizer.h"
#include "rendezvous/url.h"
#include "troupe/config.h"

namespace troupe {
namespace {

using testing::contains;

using testing::runCommand;
using testing::TempDir;
using testing::troupeBinary;

TEST(InfoCommand, SaysTheVersionBuildLibrariesDevicesAndWhatTheBuildCanRun) {
  const auto r = runCommand(troupeBinary() + " info");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(r.output.rfind(std::string("troupe ") + TROUPE_VERSION + ": cpu kernels ", 0), 0u)
      << r.output;
  for (const char* line : {"\nbuild\n",
                           "  compiler: ",
                           "  build type: ",
                           "\nlibraries\n",
                           "  oneDNN: ",
                           "  Cap'n Proto: ",
                           "  LMDB: ",
                           "  LevelDB: ",
                           "  protobuf: ",
                           "  hiredis: ",
                           "  spdlog: ",
                           "  fmt: ",
                           "  OpenSSL: ",
                           "  cairo: ",
                           "  libpng: ",
                           "\ndevices\n",
                           "  cpu: ",
                           "  hardware threads: ",
                           "  cpu kernels: ",
                           "  memory: ",
                           "\nschedules ",
                           "  local (MXNet: local): ",
                           "  device (MXNet: device): ",
                           "  bsp-allreduce: ",
                           "  dist_sync (MXNet: dist_sync, dist_device_sync): ",
                           "  dist_async (MXNet: dist_async): ",
                           "  ssp: ",
                           "\noptimizers ",
                           "  sgd (MXNet: sgd, nag): ",
                           "  adamw (MXNet: adamw): ",
                           "  lars (MXNet: lars): ",
                           "\nlayer types ",
                           "  conv: ",
                           "  add: the residual connection",
                           "\nrendezvous ",
                           "  tcp://",
                           "  file://",
                           "  redis://",
                           "\nlaunchers ",
                           "  local: ",
                           "  ssh: ",
                           "  mpi: ",
                           "  slurm: "}) {
    EXPECT_TRUE(contains(r.output, line)) << "no '" << line << "' in\n" << r.output;
  }
  EXPECT_TRUE(contains(r.output,
                       TROUPE_USE_CUDA ? "  cuda backend: built\n" : "  cuda backend: not built\n"))
      << r.output;
}

// Each table's rows, as `troupe info --json` must list them, in order: {"schedules": [...], ...}.
std::string tableNames() {
  const auto list = [](const auto& rows, auto name) {
    std::vector<std::string> quoted;
    for (const auto& row : rows)
      quoted.push_back("\"" + std::string(name(row)) + "\"");
    return "[" + fmt::format("{}", fmt::join(quoted, ", ")) + "]";
  };
  return fmt::format(
      "{{\"schedules\": {}, \"optimizers\": {}, \"layers\": {}, \"rendezvous\": {}}}",
      list(actors::schedules(), [](const auto& r) { return r.name; }),
      list(kernels::optimizers(), [](const auto& r) { return r.name; }),
      list(kernels::layerTypes(), [](const auto& r) { return r.name; }),
      list(rendezvous::storeBackends(), [](const auto& r) { return r.form; }));
}

TEST(InfoCommand, JsonParsesAndHoldsEverySection) {
  TempDir dir("info_json");
  const auto json = dir.path() / "info.json";
  const auto r = runCommand(troupeBinary() + " info --json > " + json.string());
  ASSERT_EQ(r.exit_code, 0) << r.output;
  // Python's json module, which setup.sh installs, reads it; the keys a script would use exist.
  const auto check = runCommand(
      "python3 -c 'import json, re, sys\n"
      "d = json.load(open(sys.argv[1]))\n"
      "assert set(d) == {\"troupe\", \"build\", \"libraries\", \"devices\", \"schedules\", "
      "\"optimizers\", \"layers\", \"rendezvous\", \"launchers\"}, sorted(d)\n"
      "assert d[\"troupe\"][\"version\"] == sys.argv[2]\n"
      "for lib in (\"onednn\", \"capnproto\", \"lmdb\", \"leveldb\", \"protobuf\", \"hiredis\", "
      "\"spdlog\", \"fmt\", \"openssl\", \"cairo\"):\n"
      "    assert re.search(r\"\\d+\\.\\d+\", d[\"libraries\"][lib]), (lib, d[\"libraries\"])\n"
      "assert d[\"devices\"][\"cpu_kernels\"] in (\"avx512\", \"avx2\", \"baseline\")\n"
      "assert d[\"devices\"][\"hardware_threads\"] >= 1\n"
      "assert d[\"devices\"][\"memory_bytes\"] > 0\n"
      "assert isinstance(d[\"build\"][\"cuda\"], bool)\n"
      "for section, names in json.loads(sys.argv[3]).items():\n"
      "    got = [s[\"name\"] for s in d[section]]\n"
      "    assert got == names, (section, got, names)\n"
      "assert \"dist_device_sync\" in d[\"schedules\"][4][\"mxnet\"]\n"
      "assert [l[\"name\"] for l in d[\"launchers\"]] == [\"local\", \"ssh\", \"mpi\", \"slurm\"]\n"
      "print(\"ok\")' " +
      json.string() + " " + TROUPE_VERSION + " '" + tableNames() + "'");
  EXPECT_EQ(check.exit_code, 0) << check.output << "\n" << testing::slurp(json);
  EXPECT_EQ(check.output, "ok\n");
}

TEST(InfoCommand, SaysWhatHoldsTheCpuKernelsLower) {
  const auto r = runCommand("env -u ONEDNN_MAX_CPU_ISA TROUPE_MAX_CPU_ISA=baseline " +
                            troupeBinary() + " info");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(
      contains(r.output, "  cpu kernels: baseline\n  held by: TROUPE_MAX_CPU_ISA=baseline\n"))
      << r.output;
}

}  // namespace
}  // namespace troupe
