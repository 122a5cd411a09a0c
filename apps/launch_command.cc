// `troupe launch -n WORKERS [-s SERVERS] --launcher local|ssh|mpi|slurm [-H HOSTFILE] -- troupe
// train CONFIG ...`: MXNet's tools/launch.py conventions (see launcher.h). Every option of
// launch.py is taken with its meaning or refused naming what troupe has instead (docs/flags.md):
// --env also takes MXNet's NAME (the launcher's value) and K:V, --env-worker / --env-server set
// one role's variables; -SH, --byteps-launch, --scheduler-ip, --scheduler-port and --p3 are
// refused, and so are --launcher sge and yarn (launcher.cc).
#include <fmt/format.h>
#include <CLI/CLI.hpp>

#include <algorithm>
#include <cstdlib>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "apps/commands.h"
#include "apps/launcher.h"
#include "rendezvous/url.h"
#include "troupe/error.h"

namespace troupe::apps {
namespace {

// "K=V" (troupe's) or "K:V" (MXNet's), split at the first of the two.
std::pair<std::string, std::string> variable(const char* option, const std::string& kv) {
  const auto split = kv.find_first_of("=:");
  if (split == std::string::npos || split == 0) {
    throw InputError(fmt::format("{} '{}': expected K=V (or MXNet's K:V)", option, kv));
  }
  return {kv.substr(0, split), kv.substr(split + 1)};
}

// MXNet's --env NAME[,NAME...]: this shell's value of each, which must be set.
void appendPassedVariables(const std::string& names,
                           std::vector<std::pair<std::string, std::string>>& env) {
  std::size_t start = 0;
  while (start <= names.size()) {
    const auto end = std::min(names.find(',', start), names.size());
    const std::string name = names.substr(start, end - start);
    const char* value = name.empty() ? nullptr : std::getenv(name.c_str());
    if (!value) {
      throw InputError(fmt::format(
          "--env {}: {} is not set here (a bare name passes the launcher's value, as MXNet's "
          "launch.py does; give {}=VALUE to set one)",
          names, name.empty() ? "an empty name" : name, name.empty() ? "K" : name));
    }
    env.emplace_back(name, value);
    start = end + 1;
  }
}

// MXNet's launch.py options that troupe does not have: each refused naming what it has instead.
// -S catches MXNet's -SH (CLI11 reads it as -S with the value H).
void addRefusedOptions(CLI::App* cmd) {
  auto refuse = [cmd](const std::string& names, const std::string& shown, const std::string& why) {
    cmd->add_option_function<std::string>(
           names,
           [shown, why](const std::string&) {
             throw InputError(fmt::format("{}: {}", shown, why));
           },
           "MXNet's; refused: " + why)
        ->allow_extra_args(false);
  };
  refuse("-S,--server-hostfile", "-SH/--server-hostfile",
         "MXNet's hostfile for the servers of its BytePS launcher: troupe places the servers first "
         "on the hosts of -H, then the workers (as MXNet's ssh launcher does)");
  refuse("--scheduler-ip", "--scheduler-ip",
         "the address of BytePS's scheduler: troupe launch serves its own rendezvous store "
         "(--interface picks its address; --rendezvous names another one)");
  refuse("--scheduler-port", "--scheduler-port",
         "the port of BytePS's scheduler: troupe launch serves its own rendezvous store "
         "(--interface picks its address; --rendezvous names another one)");
  cmd->add_flag_callback(
      "--byteps-launch",
      [] {
        throw InputError(
            "--byteps-launch: troupe has no BytePS launcher: its parameter servers are -s N, with "
            "troupe train --schedule dist_sync (or dist_async, ssp)");
      },
      "MXNet's; refused: troupe has no BytePS launcher");
  cmd->add_flag_callback(
      "--p3",
      [] {
        throw InputError(
            "--p3: troupe has no P3 (MXNet's priority-based parameter propagation): its nearest is "
            "sending gradients in buckets as the backward pass makes them (troupe train "
            "--bucket_size_mb, --first_bucket_mb)");
      },
      "MXNet's; refused: troupe has no P3");
}

}  // namespace

void addLaunchCommand(CLI::App& app) {
  struct State {
    LaunchOptions options;
    std::vector<std::string> env, worker_env, server_env;
  };
  auto state = std::make_shared<State>();
  auto& o = state->options;
  auto* cmd = app.add_subcommand("launch", "Start and watch the processes of a distributed run");
  cmd->add_option("-n,--num-workers", o.num_workers, "worker processes")->required();
  cmd->add_option("-s,--num-servers", o.num_servers,
                  "parameter-server processes (default 0; MXNet's launch.py starts as many as -n)");
  cmd->add_option("--launcher", o.launcher,
                  "local, ssh, mpi or slurm (default: ssh with -H, as MXNet's launch.py, else "
                  "local; MXNet's sge and yarn are refused: see slurm)");
  cmd->add_option("-H,--hostfile", o.hostfile,
                  "hosts, one host or host:port a line (ssh, the default with it; mpi)");
  cmd->add_option("--sync-dst-dir", o.sync_dst_dir,
                  "rsync the working folder there on every host first, and run there (ssh)");
  // One value per flag: an unlimited list would also eat the `--` before the command.
  cmd->add_option("--ssh-opt", o.ssh_options,
                  "one more ssh argument, e.g. --ssh-opt -i --ssh-opt KEY (repeatable; after the "
                  "words of $TROUPE_SSH_OPTS; before the launcher's own -o defaults)")
      ->allow_extra_args(false);
  cmd->add_option("--interface", o.interface,
                  "the processes listen on this interface, and the embedded store is served on its "
                  "address (default: $TROUPE_INTERFACE, else the route to the first host, loopback "
                  "if all local)");
  cmd->add_flag("--dry-run,--dry_run", o.dry_run,
                "print what would start (each process: host, role, rank, variables; the command) "
                "and start nothing");
  cmd->add_option("--env", state->env,
                  "K=V (or MXNet's K:V) set in every process, or NAME[,NAME...] passing this "
                  "shell's value of each, as MXNet's launch.py does (repeatable)")
      ->allow_extra_args(false);
  cmd->add_option("--env-worker", state->worker_env,
                  "K:V (or K=V) set in the workers only (MXNet's; repeatable)")
      ->allow_extra_args(false);
  cmd->add_option("--env-server", state->server_env,
                  "K:V (or K=V) set in the servers only (MXNet's; repeatable)")
      ->allow_extra_args(false);
  addRefusedOptions(cmd);
  cmd->add_option(
      "--rendezvous", o.rendezvous,
      rendezvous::storeUrlForms() + " (default: an embedded store served by the launcher)");
  cmd->add_option("--run_id", o.run_id, "run id (default: made up)");
  cmd->add_option("--master-addr,--master_addr", o.master_addr,
                  "torchrun's: the MASTER_ADDR every worker gets, where a torch.distributed "
                  "script's rank 0 serves its store (default: worker 0's host)");
  cmd->add_option("--master-port,--master_port", o.master_port,
                  "torchrun's: the MASTER_PORT every worker gets (default: a free port of this "
                  "host for local runs, 29500 for ssh)")
      ->check(CLI::Range(1, 65535));
  cmd->add_option("--secret-file,--secret_file", o.secret_file,
                  "file holding the run's secret (default: $TROUPE_SECRET, else a fresh one per "
                  "run); every process gets it as TROUPE_SECRET");
  cmd->add_option("--on-failure", o.on_failure,
                  "when a process fails: abort (stop them all, exit non-zero) or restart (stop "
                  "them all, start them all again from the run's newest checkpoint)")
      ->capture_default_str();
  cmd->add_option("--elastic", o.elastic,
                  "MIN:MAX: an elastic run (troupe train --num_workers MIN:MAX): a worker that "
                  "fails is left out and the others go on; more may join later (local, ssh). "
                  "A command that does not run troupe train (a torchrun script) gets torchrun's "
                  "elastic model: every "
                  "change restarts every worker with new ranks, and a launcher started with the "
                  "same --run_id and --rendezvous joins with its -n workers");
  cmd->add_option("--max-restarts", o.max_restarts,
                  "--on-failure restart, and --elastic of a torchrun script: restarts after a "
                  "failure before giving up")
      ->capture_default_str();
  cmd->add_option("command", o.command, "what every process runs, after --")->required();
  cmd->callback([state] {
    auto options = state->options;
    for (const auto& kv : state->env) {
      if (kv.find_first_of("=:") == std::string::npos) {
        appendPassedVariables(kv, options.env);
      } else {
        options.env.push_back(variable("--env", kv));
      }
    }
    for (const auto& kv : state->worker_env)
      options.worker_env.push_back(variable("--env-worker", kv));
    for (const auto& kv : state->server_env)
      options.server_env.push_back(variable("--env-server", kv));
    const int code = launch(options);
    if (code != 0) std::exit(code);
  });
}

}  // namespace troupe::apps
