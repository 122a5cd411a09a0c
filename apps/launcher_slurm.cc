// The slurm launcher: one srun for the whole world (launcher_wrapped.h), its output labelled by
// task (--label), the failing task named from the wrappers' markers or srun's own report.
#include "apps/launcher_slurm.h"

#include <arpa/inet.h>
#include <fmt/format.h>
#include <netdb.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>

#include "actors/config/cluster_env.h"
#include "actors/core/hosts.h"
#include "apps/launcher_run.h"
#include "apps/launcher_wrapped.h"
#include "transport/link.h"
#include "troupe/error.h"

namespace troupe::apps::launch_detail {
namespace {

std::optional<std::string> envValue(const char* name) {
  const char* v = std::getenv(name);
  return v && *v ? std::optional<std::string>(v) : std::nullopt;
}

bool onPath(const std::string& program) {
  const std::string path = envValue("PATH").value_or("/usr/bin:/bin");
  for (std::size_t start = 0; start <= path.size();) {
    const auto end = std::min(path.find(':', start), path.size());
    const std::string dir = end > start ? path.substr(start, end - start) : ".";
    if (::access((dir + "/" + program).c_str(), X_OK) == 0) return true;
    start = end + 1;
  }
  return false;
}

// This host's name as Slurm likely calls it: SLURMD_NODENAME inside an allocation, else the
// host name up to its first dot.
std::string thisNode() {
  if (auto name = envValue("SLURMD_NODENAME")) return *name;
  const std::string name = actors::hostName();
  return name.substr(0, name.find('.'));
}

// The IPv4 address of `host` (getaddrinfo), if it has one.
std::optional<sockaddr_in> resolve(const std::string& host) {
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* found = nullptr;
  if (::getaddrinfo(host.c_str(), "9", &hints, &found) != 0 || !found) return std::nullopt;
  sockaddr_in address{};
  std::memcpy(&address, found->ai_addr, sizeof address);
  ::freeaddrinfo(found);
  return address;
}

std::string text(const sockaddr_in& address) {
  char out[INET_ADDRSTRLEN] = {};
  ::inet_ntop(AF_INET, &address.sin_addr, out, sizeof out);
  return out;
}

// The local address packets to `node` leave from (a UDP connect sends nothing).
std::string routeSourceAddress(const std::string& node) {
  const auto to = resolve(node);
  if (!to) {
    throw IoError(fmt::format(
        "--launcher slurm: cannot resolve node '{}' of SLURM_JOB_NODELIST for the rendezvous "
        "store; give --interface",
        node));
  }
  const int fd = ::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  sockaddr_in local{};
  socklen_t len = sizeof local;
  const bool ok = fd >= 0 &&
                  ::connect(fd, reinterpret_cast<const sockaddr*>(&*to), sizeof *to) == 0 &&
                  ::getsockname(fd, reinterpret_cast<sockaddr*>(&local), &len) == 0;
  const int err = errno;
  if (fd >= 0) ::close(fd);
  if (!ok) {
    throw IoError(
        fmt::format("--launcher slurm: no route to node '{}' for the rendezvous store: {}", node,
                    std::strerror(err)));
  }
  return text(local);
}

// Parses "TASK: text" (srun --label pads TASK with spaces); false for srun's own lines.
bool parseLabelled(std::string_view line, int& task, std::string_view& text) {
  const auto first = line.find_first_not_of(' ');
  if (first == std::string_view::npos) return false;
  const auto colon = line.find(": ", first);
  if (colon == std::string_view::npos || colon == first || colon - first > 6) return false;
  const std::string digits(line.substr(first, colon - first));
  if (digits.find_first_not_of("0123456789") != std::string::npos) return false;
  task = std::atoi(digits.c_str());
  text = line.substr(colon + 2);
  return true;
}

// Reads srun's report of the first task that ended badly: "srun: error: HOST: task N: Exited
// with exit code C", or the name of the signal that killed it ("... task N: Killed"). Of tasks
// reported together ("tasks 0-1: Killed") the first is named, and the others said.
void parseSrunLine(std::string_view line, std::optional<TaskFailure>& failure) {
  if (failure || line.rfind("srun: error: ", 0) != 0) return;
  const std::string rest(line.substr(13));
  auto at = rest.find(": task ");
  const bool several = at == std::string::npos;
  if (several) at = rest.find(": tasks ");
  if (at == std::string::npos) return;
  const auto list_at = at + (several ? 8 : 7);
  const auto end = rest.find(": ", list_at);
  if (end == std::string::npos) return;
  const std::string list = rest.substr(list_at, end - list_at);
  int task = 0, code = 0;
  if (std::sscanf(list.c_str(), "%d", &task) != 1) return;
  const std::string what = rest.substr(end + 2);
  TaskFailure f{task, rest.substr(0, at), "", 1};
  if (std::sscanf(what.c_str(), "Exited with exit code %d", &code) == 1) {
    f.what = fmt::format("exited with code {}", code);
    f.code = code;
  } else {
    f.what = fmt::format("ended: {}", what);
    for (int sig = 1; sig < NSIG; ++sig) {
      if (what == strsignal(sig)) {
        f.what = fmt::format("was killed by signal {} ({})", sig, what);
        f.code = 128 + sig;
        break;
      }
    }
  }
  if (several) f.what += fmt::format(" (srun reports tasks {} so at once)", list);
  failure = std::move(f);
}

// torchrun's variables from Slurm's: the task's rank and node, the tasks of its node (this node's
// count in SLURM_STEP_TASKS_PER_NODE, "2(x3),1": 2 on each of the first 3 nodes, then 1), and the
// step's first node for MASTER_ADDR (where task 0 runs: srun places tasks in blocks of nodes).
std::string torchrunOfSlurm(const RunContext& run) {
  const std::string tasks_here =
      "n=$SLURM_NODEID; LWS=; for p in $(echo \"$SLURM_STEP_TASKS_PER_NODE\" | tr , ' '); do "
      "c=${p%%(*}; k=1; case $p in *x*) k=${p#*x}; k=${k%)};; esac; "
      "if [ \"$n\" -lt \"$k\" ]; then LWS=$c; break; fi; n=$((n - k)); done; ";
  return torchrunExports(run, tasks_here,
                         {"$SLURM_PROCID", "$SLURM_LOCALID", "$LWS", "$SLURM_NODEID",
                          "${SLURM_STEP_NUM_NODES:-$SLURM_NNODES}",
                          "$(scontrol show hostnames \"$SLURM_STEP_NODELIST\" | head -n1)"},
                         masterPort(run, false));
}

// srun's command line; the values of `env` go in its environment (srun --export=ALL).
std::vector<std::string> srunCommand(const RunContext& run) {
  const auto& o = run.options;
  std::vector<std::string> argv{
      "srun",
      "--ntasks=" + std::to_string(o.num_servers + o.num_workers),
      "--label",
      "--kill-on-bad-exit=1",
      "--export=ALL",
      "--job-name=troupe-" + run.run_id,
      "sh",
      "-c",
      wrapperScript(o.num_servers, "SLURM_PROCID", "srun", "${SLURMD_NODENAME:-$(uname -n)}",
                    "step $SLURM_JOB_ID.$SLURM_STEP_ID", torchrunOfSlurm(run)),
      "troupe-launch"};
  argv.insert(argv.end(), run.command.begin(), run.command.end());
  return argv;
}

class Srun final : public WrappedStarter {
 public:
  explicit Srun(const RunContext& run) : run_(run) {}

  std::vector<std::string> command(const Env&) override { return srunCommand(run_); }
  bool parseTag(std::string_view line, int& task, std::string_view& text) const override {
    return parseLabelled(line, task, text);
  }
  void parseOwnLine(std::string_view line, std::optional<TaskFailure>& failure) override {
    parseSrunLine(line, failure);
  }
  void taskStarted(std::string_view extra) override {
    char step[64] = {};
    if (std::sscanf(std::string(extra).c_str(), " step %63s", step) == 1) step_ = step;
  }
  // The step by scancel (srun may be past taking signals), then srun.
  void kill(pid_t srun) override {
    if (!step_.empty()) {
      runAll({{"scancel", "--signal=KILL", "--full", step_}}, std::chrono::seconds(30), &run_.relay,
             {"scancel"});
    }
    ::kill(-srun, SIGKILL);
  }

 private:
  const RunContext& run_;
  std::string step_;  // "JOB.STEP", once a task reported it
};

}  // namespace

void checkSlurmLaunch(const LaunchOptions& o) {
  if (!onPath("srun")) {
    throw InputError(
        "--launcher slurm: srun is not on PATH (install Slurm's client: Debian's slurm-client)");
  }
  if (!envValue("SLURM_JOB_ID")) return;
  const auto tasks = envValue("SLURM_NTASKS");
  if (!tasks) return;
  const bool digits =
      tasks->size() <= 9 && tasks->find_first_not_of("0123456789") == std::string::npos;
  if (!digits) {
    throw InputError(
        fmt::format("SLURM_NTASKS='{}': expected the allocation's number of tasks", *tasks));
  }
  const int have = std::atoi(tasks->c_str());
  const int want = o.num_workers + o.num_servers;
  if (have < want) {
    throw InputError(fmt::format(
        "--launcher slurm: the run has {} process(es) ({} worker(s), {} server(s)) but this Slurm "
        "allocation (job {}) has {} task(s) (SLURM_NTASKS={}): ask sbatch or salloc for -n {}, or "
        "launch fewer",
        want, o.num_workers, o.num_servers, *envValue("SLURM_JOB_ID"), have, have, want));
  }
}

std::string slurmStoreBindAddress(const LaunchOptions& o) {
  std::string interface = o.interface;
  if (interface.empty()) interface = envValue("TROUPE_INTERFACE").value_or("");
  if (!interface.empty()) return transport::resolveInterface(interface);
  const std::string self = thisNode();
  if (const auto list = envValue("SLURM_JOB_NODELIST")) {
    for (const auto& node : actors::expandSlurmHostlist(*list, "SLURM_JOB_NODELIST=" + *list)) {
      if (node != self) return routeSourceAddress(node);
    }
    return "127.0.0.1";
  }
  // Not in an allocation: the nodes srun will get are not known yet.
  const auto address = resolve(self);
  return address ? text(*address) : "127.0.0.1";
}

Attempt runSlurm(const RunContext& run) {
  Srun srun(run);
  return runWrapped(run, {"srun", "step", "task", "node"}, srun);
}

}  // namespace troupe::apps::launch_detail
