// MXNet's tools/launch.py options on `troupe launch`: docs/flags.md's table holds, row by row,
// through the binary, and every option of launch.py has a row.
#include <gtest/gtest.h>

#include <set>
#include <string>

#include "cli_util.h"
#include "flags_doc.h"
#include "launch_util.h"

namespace troupe::testing {
namespace {

const std::string& flagsDoc() {
  static const std::string path = sourceDir() + "/docs/flags.md";
  return path;
}

std::string launchIn(const TempDir& dir, const std::string& args) {
  return "cd " + dir.str() + " && " + troupeBinary() + " launch " + args;
}

// Each row of a section of docs/flags.md's on `troupe launch`: listed in its help, refused with
// its error, or run with its output.
void checkLaunchRows(const std::vector<FlagRow>& rows) {
  const auto help = runCommand(troupeBinary() + " launch --help");
  for (const auto& row : rows) {
    const std::string where =
        "docs/flags.md:" + std::to_string(row.line) + " (" + row.example + ")";
    if (row.kind == "listed") {
      EXPECT_TRUE(contains(help.output, row.text)) << where << "\n" << help.output;
      continue;
    }
    TempDir cwd("launch_mxnet_row");
    const auto r = runCommand(launchIn(cwd, row.example));
    if (row.kind == "refused") {
      EXPECT_TRUE(exitedWith(r, 1, {"[error] " + row.text})) << where;
    } else if (row.kind == "runs") {
      EXPECT_TRUE(exitedWith(r, 0, {row.text})) << where;
    } else {
      ADD_FAILURE() << where << ": a row of this table says runs:, refused: or listed:";
    }
  }
}

TEST(LaunchMxnetOptions, EveryRowOfTheTableIsWhatTroupeLaunchDoes) {
  const auto rows = flagRows(flagsDoc(), "## MXNet's tools/launch.py");
  ASSERT_GT(rows.size(), 15u);
  checkLaunchRows(rows);
}

// torchrun's variables and options (tests/launch_local_test.cc runs a torchrun script).
TEST(LaunchTorchrunOptions, EveryRowOfTheTableIsWhatTroupeLaunchDoes) {
  const auto rows = flagRows(flagsDoc(), "## torchrun's options and variables");
  ASSERT_GT(rows.size(), 10u);
  checkLaunchRows(rows);
}

// tools/launch.py's options (apache/mxnet, with BytePS's and P3's) and the command.
TEST(LaunchMxnetOptions, EveryOptionOfLaunchPyHasARow) {
  std::set<std::string> documented;
  for (const auto& row : flagRows(flagsDoc(), "## MXNet's tools/launch.py"))
    documented.insert(row.flag);
  for (const char* option :
       {"-n, --num-workers", "-s, --num-servers", "-H, --hostfile", "-SH, --server-hostfile",
        "--sync-dst-dir", "--launcher", "--byteps-launch", "--scheduler-ip", "--scheduler-port",
        "--env-server", "--env-worker", "--env", "--p3", "command"}) {
    EXPECT_TRUE(documented.count(option)) << option;
  }
}

TEST(LaunchMxnetOptions, RoleVariablesReachOnlyTheirRoleWithSpacesAndQuotes) {
  TempDir cwd("launch_mxnet_role_env");
  const auto r = runCommand(
      launchIn(cwd,
               "-n 2 -s 1 --env-worker \"W=a b'c\" --env-server S:x=y --env A=1 -- bash -c "
               "'echo \"[$W][$S][$A]\"'"));
  EXPECT_TRUE(exitedWith(
      r, 0, {"[worker 0] [a b'c][][1]", "[worker 1] [a b'c][][1]", "[server 0] [][x=y][1]"}));
}

TEST(LaunchMxnetOptions, ABareEnvNamePassesTheLaunchersValues) {
  TempDir cwd("launch_mxnet_env_names");
  const auto r = runCommand("cd " + cwd.str() + " && P='p q' Q=2 " + troupeBinary() +
                            " launch -n 1 --env P,Q -- bash -c 'echo \"[$P][$Q]\"'");
  EXPECT_TRUE(exitedWith(r, 0, {"[worker 0] [p q][2]"}));
}

TEST(LaunchMxnetOptions, ARoleVariableThatIsNoNameIsRefused) {
  TempDir cwd("launch_mxnet_bad_name");
  EXPECT_TRUE(exitedWith(runCommand(launchIn(cwd, "-n 1 --env-server 'A B:1' -- true")), 1,
                         {"[error] --env-server 'A B=1': 'A B' is not a variable name"}));
  EXPECT_TRUE(exitedWith(runCommand(launchIn(cwd, "-n 1 --env-worker =1 -- true")), 1,
                         {"[error] --env-worker '=1': expected K=V (or MXNet's K:V)"}));
}

}  // namespace
}  // namespace troupe::testing
