// The mpi launcher: one Open MPI mpirun for the whole world (launcher_wrapped.h), its output tagged
// by rank (--tag-output), the failing rank named from the wrappers' markers or mpirun's own report.
#include <fcntl.h>
#include <fmt/format.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <optional>

#include "apps/launcher_run.h"
#include "apps/launcher_ssh.h"
#include "apps/launcher_wrapped.h"
#include "troupe/error.h"

namespace troupe::apps::launch_detail {
namespace {

// A removed-on-destruction Open MPI hostfile.
class MpiHostfile {
 public:
  explicit MpiHostfile(const std::vector<LaunchHost>& hosts) {
    std::vector<std::pair<std::string, int>> slots;
    for (const auto& h : hosts) {
      auto it = std::find_if(slots.begin(), slots.end(),
                             [&](const auto& s) { return s.first == h.name; });
      if (it == slots.end()) {
        slots.emplace_back(h.name, 1);
      } else {
        ++it->second;
      }
    }
    std::string text;
    for (const auto& [name, n] : slots)
      text += fmt::format("{} slots={}\n", name, n);
    char path[] = "/tmp/troupe_mpi_hosts_XXXXXX";
    const int fd = ::mkstemp(path);
    if (fd < 0) throw IoError(fmt::format("mkstemp {}: {}", path, std::strerror(errno)));
    path_ = path;
    const bool ok = ::write(fd, text.data(), text.size()) == static_cast<ssize_t>(text.size());
    ::close(fd);
    if (!ok) throw IoError(fmt::format("cannot write {}", path_));
  }
  ~MpiHostfile() { ::unlink(path_.c_str()); }
  MpiHostfile(const MpiHostfile&) = delete;
  MpiHostfile& operator=(const MpiHostfile&) = delete;
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// Parses "[JOB,RANK]<stream>:text" (mpirun --tag-output); false for mpirun's own lines.
bool parseTagged(std::string_view line, int& world_rank, std::string_view& text) {
  if (line.empty() || line[0] != '[') return false;
  const auto close = line.find("]<");
  const auto comma = line.find(',');
  if (close == std::string_view::npos || comma == std::string_view::npos || comma > close) {
    return false;
  }
  const auto body = line.find(">:", close);
  if (body == std::string_view::npos) return false;
  const std::string digits(line.substr(comma + 1, close - comma - 1));
  if (digits.empty() || digits.find_first_not_of("0123456789") != std::string::npos) return false;
  world_rank = std::atoi(digits.c_str());
  text = line.substr(body + 2);
  return true;
}

// Reads mpirun's own report of the rank that failed (Open MPI 4 wording).
void parseMpirunLine(std::string_view line, std::optional<int>& pending_rank,
                     std::optional<TaskFailure>& failure) {
  if (failure) return;
  const std::string text(line);
  int job = 0, rank = 0, code = 0, sig = 0;
  long pid = 0;
  if (const auto at = text.find("Process name: [["); at != std::string::npos) {
    if (std::sscanf(text.c_str() + at, "Process name: [[%d,%*d],%d]", &job, &rank) == 2) {
      pending_rank = rank;
    }
  } else if (const auto at = text.find("Exit code:"); at != std::string::npos && pending_rank) {
    if (std::sscanf(text.c_str() + at, "Exit code: %d", &code) == 1) {
      failure = TaskFailure{*pending_rank, "", fmt::format("exited with code {}", code), code};
    }
  } else if (const auto at = text.find("noticed that process rank "); at != std::string::npos) {
    char host[256] = {};
    if (std::sscanf(text.c_str() + at,
                    "noticed that process rank %d with PID %ld on node %255s exited on signal %d",
                    &rank, &pid, host, &sig) == 4) {
      failure = TaskFailure{
          rank, host, fmt::format("was killed by signal {} ({})", sig, strsignal(sig)), 128 + sig};
    }
  }
}

// mpirun's command line (the values of `env` go in its environment: `-x NAME` only).
std::vector<std::string> mpirunCommand(const RunContext& run, const Env& env,
                                       const MpiHostfile* hostfile) {
  const auto& o = run.options;
  std::vector<std::string> argv{"mpirun",
                                "-np",
                                std::to_string(o.num_servers + o.num_workers),
                                "--tag-output",
                                "--oversubscribe",
                                "--allow-run-as-root"};
  if (hostfile) {
    argv.insert(argv.end(), {"--hostfile", hostfile->path()});
    auto agent_args = userSshOptions(o);
    const int port = run.hosts[0].port;
    for (const auto& h : run.hosts) {
      if (h.port != port) {
        throw InputError(fmt::format(
            "-H {}:{}: host {} has a different ssh port than {}: mpirun takes one port for all",
            o.hostfile, h.line, h.display(), run.hosts[0].display()));
      }
    }
    if (port) agent_args.insert(agent_args.end(), {"-p", std::to_string(port)});
    if (!agent_args.empty()) {
      argv.insert(argv.end(), {"--mca", "plm_rsh_args", join(agent_args)});
    }
  }
  // No value (the run's secret among them) stands on a command line.
  for (const auto& kv : env)
    argv.insert(argv.end(), {"-x", kv.first});
  // torchrun's variables from Open MPI's; rank 0 runs on the hostfile's first host (mpirun fills
  // the hosts' slots in order), or here.
  const bool here = run.hosts.empty();
  const std::string torchrun = torchrunExports(
      run, "",
      {"$OMPI_COMM_WORLD_RANK", "$OMPI_COMM_WORLD_LOCAL_RANK", "$OMPI_COMM_WORLD_LOCAL_SIZE", "",
       "", here ? "127.0.0.1" : run.hosts.front().name},
      masterPort(run, here));
  argv.insert(argv.end(), {"sh", "-c",
                           wrapperScript(o.num_servers, "OMPI_COMM_WORLD_RANK", "mpirun",
                                         "$(uname -n)", "", torchrun),
                           "troupe-launch"});
  argv.insert(argv.end(), run.command.begin(), run.command.end());
  return argv;
}

class Mpirun final : public WrappedStarter {
 public:
  explicit Mpirun(const RunContext& run) : run_(run) {}

  std::vector<std::string> command(const Env& env) override {
    if (!run_.hosts.empty()) hostfile_ = std::make_unique<MpiHostfile>(run_.hosts);
    return mpirunCommand(run_, env, hostfile_.get());
  }
  bool parseTag(std::string_view line, int& task, std::string_view& text) const override {
    return parseTagged(line, task, text);
  }
  std::size_t nextTag(std::string_view text) const override {
    for (auto at = text.find('['); at != std::string_view::npos; at = text.find('[', at + 1)) {
      int task = 0;
      std::string_view rest;
      if (parseTagged(text.substr(at), task, rest)) return at;
    }
    return std::string_view::npos;
  }
  void parseOwnLine(std::string_view line, std::optional<TaskFailure>& failure) override {
    parseMpirunLine(line, pending_rank_, failure);
  }
  void taskStarted(std::string_view) override {}
  void kill(pid_t mpirun) override { ::kill(-mpirun, SIGKILL); }

 private:
  const RunContext& run_;
  std::unique_ptr<MpiHostfile> hostfile_;  // for as long as mpirun runs
  std::optional<int> pending_rank_;        // named by mpirun's report, its exit code to come
};

}  // namespace

Attempt runMpi(const RunContext& run) {
  Mpirun mpirun(run);
  return runWrapped(run, {"mpirun", "job", "rank", "host"}, mpirun);
}

}  // namespace troupe::apps::launch_detail
