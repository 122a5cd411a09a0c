// The launcher's ssh side (apps/launcher*.cc only; see launcher.h for the protocol): ssh command
// lines, the remote script, --sync-dst-dir, and where the embedded store listens for remote
// hosts.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "apps/launcher.h"
#include "apps/launcher_process.h"

namespace troupe::apps {
class OutputRelay;
}  // namespace troupe::apps

namespace troupe::apps::launch_detail {

// Lines a remote wrapper (ssh's remote script, mpirun's rank wrapper) prints for the launcher
// alone; never relayed.
inline constexpr std::string_view kMarker = "@@troupe-launch@@";

// ssh options from $TROUPE_SSH_OPTS and --ssh-opt, first so that they override the defaults
// (ssh keeps the first value of each -o option).
std::vector<std::string> userSshOptions(const LaunchOptions& o);

// `ssh [options] [-p PORT]` without the host.
std::vector<std::string> sshCommand(const std::vector<std::string>& user_options,
                                    const LaunchHost& host);

// `ssh [options] [-p PORT] HOST SCRIPT`.
std::vector<std::string> sshRun(const std::vector<std::string>& user_options,
                                const LaunchHost& host, const std::string& script);

// Copies the current folder to `dir` on every host (MXNet's --sync-dst-dir), one host at a time,
// saying so and relaying what ssh and rsync print. IoError naming the host when one fails.
void syncFolder(const std::vector<LaunchHost>& hosts, const std::vector<std::string>& user_options,
                const std::string& dir, const std::string& hostfile, OutputRelay& relay);

// Starts `command` on `host` in `dir` with `env`. The run's secret goes through ssh's stdin,
// which the remote shell reads before anything else: it stands on no command line, here or there.
Spawned spawnSsh(const std::vector<std::string>& ssh_options, const LaunchHost& host,
                 const std::string& dir, Env env, const std::vector<std::string>& command);

// Where the embedded store listens so that every host can reach it.
std::string storeBindAddress(const LaunchOptions& o, const std::vector<LaunchHost>& hosts);

}  // namespace troupe::apps::launch_detail
