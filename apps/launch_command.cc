// `troupe launch -n WORKERS [-s SERVERS] --launcher local|ssh|mpi|slurm [-H HOSTFILE] -- troupe
// train CONFIG ...`: MXNet's tools/launch.py conventions (see launcher.h).
#include <fmt/format.h>
#include <CLI/CLI.hpp>

#include <cstdlib>
#include <memory>

#include "apps/commands.h"
#include "apps/launcher.h"
#include "troupe/error.h"

namespace troupe::apps {

void addLaunchCommand(CLI::App& app) {
  struct State {
    LaunchOptions options;
    std::vector<std::string> env;
  };
  auto state = std::make_shared<State>();
  auto& o = state->options;
  auto* cmd = app.add_subcommand("launch", "Start and watch the processes of a distributed run");
  cmd->add_option("-n,--num-workers", o.num_workers, "worker processes")->required();
  cmd->add_option("-s,--num-servers", o.num_servers, "parameter-server processes");
  cmd->add_option("--launcher", o.launcher, "local, ssh, mpi or slurm")->capture_default_str();
  cmd->add_option("-H,--hostfile", o.hostfile, "hosts, one host or host:port a line (ssh, mpi)");
  cmd->add_option("--sync-dst-dir", o.sync_dst_dir,
                  "rsync the working folder there on every host first, and run there (ssh)");
  // One value per flag: an unlimited list would also eat the `--` before the command.
  cmd->add_option("--ssh-opt", o.ssh_options,
                  "one more ssh argument, e.g. --ssh-opt -i --ssh-opt KEY (repeatable; after the "
                  "words of $TROUPE_SSH_OPTS; before the launcher's own -o defaults)")
      ->allow_extra_args(false);
  cmd->add_option("--interface", o.interface,
                  "ssh, mpi, slurm: serve the embedded store on this interface's address (default: "
                  "$TROUPE_INTERFACE, else the route to the first host, loopback if all local)");
  cmd->add_option("--env", state->env, "K=V set in every process (repeatable)")
      ->allow_extra_args(false);
  cmd->add_option("--rendezvous", o.rendezvous,
                  "tcp://HOST:PORT | file:///dir | redis://[:PASSWORD@]HOST:PORT "
                  "(default: an embedded store served by the launcher)");
  cmd->add_option("--run_id", o.run_id, "run id (default: made up)");
  cmd->add_option("--secret-file,--secret_file", o.secret_file,
                  "file holding the run's secret (default: $TROUPE_SECRET, else a fresh one per "
                  "run); every process gets it as TROUPE_SECRET");
  cmd->add_option("--on-failure", o.on_failure,
                  "when a process fails: abort (stop them all, exit non-zero) or restart (stop "
                  "them all, start them all again from the run's newest checkpoint)")
      ->capture_default_str();
  cmd->add_option("--elastic", o.elastic,
                  "MIN:MAX: an elastic run (troupe train --num_workers MIN:MAX): a worker that "
                  "fails is left out and the others go on; more may join later (local, ssh)");
  cmd->add_option("--max-restarts", o.max_restarts,
                  "--on-failure restart: restarts before giving up")
      ->capture_default_str();
  cmd->add_option("command", o.command, "what every process runs, after --")->required();
  cmd->callback([state] {
    auto options = state->options;
    for (const auto& kv : state->env) {
      const auto eq = kv.find('=');
      if (eq == std::string::npos || eq == 0) {
        throw InputError(fmt::format("--env '{}': expected K=V", kv));
      }
      options.env.emplace_back(kv.substr(0, eq), kv.substr(eq + 1));
    }
    const int code = launch(options);
    if (code != 0) std::exit(code);
  });
}

}  // namespace troupe::apps
