// Launchers that run one command for the whole world (apps/launcher*.cc only; see
// launcher_run.h): mpirun (launcher_mpi.cc) and srun (launcher_slurm.cc). The command starts every
// task under wrapperScript(), which maps the task's index in the world to TROUPE_ROLE and
// TROUPE_RANK and reports the task's host, pid and exit code on marker lines; runWrapped() relays
// the tasks' lines with role and rank, names the failing task from the markers (else from the
// starter's own report), and stops the command on the launcher's stop signal. What differs from
// one starter to the next is a WrappedStarter.
//
// Everything here runs on the launcher's main thread.
#pragma once

#include <sys/types.h>

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "apps/launcher_failure.h"
#include "apps/launcher_process.h"

namespace troupe::apps::launch_detail {

struct RunContext;
struct TorchrunPlace;

// A failed task as its starter reports it.
struct TaskFailure {
  int task = -1;     // the index in the world: servers first, then workers
  std::string host;  // empty: not said
  std::string what;  // "exited with code 3"
  int code = 0;      // the launcher's exit code for it; 0: the starter's own
};

// How the launcher's lines name a starter and what it runs.
struct StarterWords {
  std::string_view name;   // "mpirun": also the prefix of its own relayed lines
  std::string_view group;  // what it ends when a task fails: "job", "step"
  std::string_view task;   // "rank", "task"
  std::string_view place;  // "host", "node"
};

// What one starter does its own way. Main thread only; none of it is called after runWrapped()
// returns.
class WrappedStarter {
 public:
  virtual ~WrappedStarter() = default;

  // The command line that starts the world, every task under wrapperScript(); the values of `env`
  // go in its environment, never on the line. Throws InputError or IoError before anything starts.
  virtual std::vector<std::string> command(const Env& env) = 0;

  // The task (its index in the world) one line of the command's output came from, and the task's
  // text; false for the starter's own lines.
  virtual bool parseTag(std::string_view line, int& task, std::string_view& text) const = 0;

  // Where in a task's text another task's tag begins: the starter tagged the first part of a
  // task's line, then another task's output before that line's end (mpirun does, a write at a
  // time); npos where it never does.
  virtual std::size_t nextTag(std::string_view) const { return std::string_view::npos; }

  // Reads one of the starter's own lines for its report of a failed task; sets `failure` once.
  // Not called after the launcher's stop signal: what fails then is no failure to name.
  virtual void parseOwnLine(std::string_view line, std::optional<TaskFailure>& failure) = 0;

  // A task reported its host and pid; `extra` is the rest of that marker line (wrapperScript's
  // `extra`, expanded).
  virtual void taskStarted(std::string_view extra) = 0;

  // Ends the command and its tasks, SIGTERM not having done so within the grace period.
  virtual void kill(pid_t command) = 0;
};

// The script each task runs as `sh -c SCRIPT troupe-launch COMMAND...`: maps $`rank_variable` (the
// task's index in the world; unset: refused, naming `starter`) to TROUPE_ROLE and TROUPE_RANK
// (servers first), prints "MARKER host HOST pid PID[ EXTRA]" (`host` and `extra` expanded by the
// task's shell), runs the command and prints "MARKER exit CODE". Not exec: starters signal every
// process of a task, so the command goes with its shell, and the exit marker names the task that
// failed first even when the starter prints no report (mpirun does not when it had to kill the
// other ranks).
// `worker_env`: shell code a worker's task runs before the command (torchrunExports).
std::string wrapperScript(int num_servers, std::string_view rank_variable, std::string_view starter,
                          std::string_view host, std::string_view extra,
                          std::string_view worker_env = {});

// torchrun's variables (launcher_run.h: torchrunVariables) as a worker task's shell exports, its
// place given as the starter's variables, after `prelude` (shell code that computes some). None
// with parameter servers: a task's place among the workers is not known before the tasks start.
std::string torchrunExports(const RunContext& run, std::string_view prelude,
                            const TorchrunPlace& place, int port);

// One start of the world by `starter`'s command; see launcher_run.h. SIGTERM to the command on the
// launcher's stop signal, starter.kill() after the grace period.
Attempt runWrapped(const RunContext& run, const StarterWords& words, WrappedStarter& starter);

}  // namespace troupe::apps::launch_detail
