// Starting and watching the processes of a run, as MXNet's tools/launch.py does.
//
// Each process gets its role and rank in its environment (TROUPE_ROLE=worker|server, TROUPE_RANK,
// TROUPE_NUM_WORKERS, TROUPE_NUM_SERVERS, TROUPE_RUN_ID, TROUPE_GENERATION, TROUPE_RENDEZVOUS, and
// every --env K=V). Every line a process prints is relayed with its role and rank in front
// ("[worker 1] ..."). When any process exits non-zero or dies of a signal, the launcher stops the
// others (SIGTERM and SIGCONT, so that a stopped process acts on it too, then SIGKILL after a
// grace period) and names the one that failed (host, role, rank, exit code or signal); if within
// 0.5 s of a first failure another process turns out killed by a signal, that one is named (the
// first is likely its peer, failing for want of it). A process that failed for want of a peer
// and said so on a culprit line ("troupe-culprit: server 0: REASON", see launcher_failure.h) has
// that peer named first: "server 0 on HOST (pid P) is hung or gone: REASON; reported by worker 0,
// which exited with code 1" (local: "is stopped (SIGSTOP or a stopped terminal)" when it is). Then,
// on_failure "abort": it returns non-zero. "restart" (the model of torchelastic): once every
// process of the world is gone it starts them all again, as generation 1, 2 ... (TROUPE_GENERATION;
// the run id stays), each generation with a fresh embedded store, so nothing of an earlier one can
// mix in; a training process of generation > 0 resumes from the newest complete checkpoint of the
// run (see TrainOptions::generation). After max_restarts restarts it gives up, naming the last
// failure. A launcher stopped by SIGINT, SIGTERM or SIGHUP never restarts. With `elastic`
// (MIN:MAX, local and ssh launchers) a process that fails is left out and the others go on (they
// re-form without it, actors/run/elastic.h); see LaunchOptions::elastic.
//
// Launchers:
//  - local: fork/exec on this host; each process in its own process group.
//  - ssh: one `ssh [ssh options] -o BatchMode=yes -o StrictHostKeyChecking=no -o ConnectTimeout=20
//    -o LogLevel=ERROR [-p PORT] HOST SCRIPT` per process, hosts from the hostfile assigned
//    round-robin, servers first from the first host, then workers again from the first host
//    (MXNet's ssh launcher). ssh options come from $TROUPE_SSH_OPTS (split on whitespace), then
//    from each --ssh-opt (one ssh argument each); being first they override the defaults (ssh
//    keeps the first value of an -o option). The ssh client's stdin is /dev/null. SCRIPT is
//    `cd DIR && echo MARKER pid $$ && env K=V... COMMAND; rc=$?; echo MARKER exit $rc; exit $rc`,
//    every word shell-quoted, DIR being --sync-dst-dir (the current folder is first rsync'ed there,
//    `rsync -az -e 'ssh ...' ./ HOST:DIR/`, once per distinct host) or the current folder; the
//    remote login shell must be POSIX. Stopping a remote process: sshd runs the remote shell as a
//    session and process-group leader with no tty, and that shell reports its pid ($$, so its
//    group) in the first marker line, which the launcher swallows. To stop it the launcher runs a
//    second `ssh HOST 'kill -s TERM -- -PGID; kill -s CONT -- -PGID'`, after which the ssh client
//    ends by itself; after the grace period `kill -s KILL` goes the same way and the local client
//    gets SIGKILL. Each such ssh runs with the main loop paused, for at most 30 s. The one gap: a
//    launcher killed with SIGKILL cannot clean up; its ssh clients die with it (PR_SET_PDEATHSIG)
//    and the remote processes go on until they next write output (SIGPIPE). SIGINT, SIGTERM and
//    SIGHUP to the launcher stop every remote process first. A host that cannot be reached (ssh
//    exits before the remote shell reported its pid) is named with the role, rank and ssh's exit
//    code.
//  - mpi: one `mpirun -np S+W [--hostfile H] --tag-output --oversubscribe --allow-run-as-root
//    [--mca plm_rsh_args ARGS] -x K=V... sh -c WRAPPER COMMAND...` (Open MPI). WRAPPER maps
//    OMPI_COMM_WORLD_RANK to TROUPE_ROLE/TROUPE_RANK (ranks 0..S-1 servers, then workers), reports
//    its host and pid in a marker line, runs COMMAND (not exec'd: Open MPI signals each rank's
//    process group, so COMMAND goes with it) and reports its exit code in another marker line.
//    mpirun's "[job,rank]<stdout>:" tags become role/rank prefixes, its own lines "[mpirun] ...".
//    When a rank fails mpirun ends the job; the launcher names the first rank whose marker
//    reported a non-zero exit, else the rank in mpirun's own report (a rank whose wrapper died
//    of a signal), else says that mpirun failed without naming one. Hostfile entries become an
//    Open MPI hostfile (`host slots=K`); a port, if any, must be the same for every host and goes
//    with the ssh options to Open MPI's ssh agent (plm_rsh_args).
//  - slurm: one `srun --ntasks=S+W --label --kill-on-bad-exit=1 --export=ALL
//    --job-name=troupe-RUN_ID sh -c WRAPPER COMMAND...` (launcher_slurm.h), inside the current
//    allocation (sbatch, salloc) or asking for one of S+W tasks; srun takes its other options from
//    Slurm's own variables (SLURM_PARTITION, SLURM_TIMELIMIT, SLURM_ACCOUNT, SLURM_OVERCOMMIT ...),
//    and takes no -H. Inside an allocation of fewer tasks (SLURM_NTASKS) than S+W it refuses to
//    start, naming both numbers. WRAPPER maps SLURM_PROCID to TROUPE_ROLE/TROUPE_RANK (ranks
//    0..S-1 servers, then workers), reports its node, pid and step in a marker line, runs COMMAND
//    (not exec'd: Slurm signals every process of the step) and reports its exit code in another.
//    srun's "TASK: " labels become role/rank prefixes, its own lines "[srun] ...". When a task
//    exits non-zero srun ends the step (--kill-on-bad-exit); the launcher names the first task
//    whose marker reported a non-zero exit, else the task srun reports first ("srun: error: NODE:
//    task N: ..."), else says that srun failed without naming one. Stopping: SIGTERM to srun
//    (which cancels its step), after the grace period `scancel --signal=KILL --full JOB.STEP`
//    and SIGKILL to srun. The values of the environment (the run's secret among them) go in
//    srun's environment, never on its command line. Processes that srun starts without a
//    launcher (`srun troupe train ...`) take their place from SLURM_* themselves:
//    actors/config/cluster_env.h.
//
// The launcher's output never holds up its supervision: every line it prints or relays goes
// through a bounded OutputRelay (output_relay.h) with writer threads of its own; what a reader
// that stalls cannot take is dropped and counted ("[launcher] N lines dropped: the launcher's
// output was not read for S s"), SIGPIPE is ignored (a reader that is gone makes later lines
// dropped, not the launcher dead), and at the end the launcher flushes for at most 5 s and exits
// with the run's code regardless.
//
// The embedded rendezvous store binds 127.0.0.1 for local, and for ssh and mpi: the address of
// --interface / $TROUPE_INTERFACE if given, else loopback when every host is localhost or 127.x
// (or there is no hostfile), else the address this host's route to the first non-loopback host
// leaves from; for slurm, see slurmStoreBindAddress (launcher_slurm.h).
#pragma once

#include <chrono>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace troupe::apps {

struct LaunchOptions {
  int num_workers = 1;
  int num_servers = 0;
  // local, ssh, mpi or slurm (MXNet's sge, yarn: InputError); empty: ssh with a hostfile, as
  // MXNet's launch.py, else local.
  std::string launcher;
  std::string hostfile;                                  // required for ssh; optional for mpi
  std::string sync_dst_dir;                              // ssh only
  std::vector<std::pair<std::string, std::string>> env;  // --env K=V
  // MXNet's --env-worker / --env-server: K=V in the workers' (the servers') environment only. The
  // command then runs under `sh -c`, which exports them by TROUPE_ROLE before it execs it.
  std::vector<std::pair<std::string, std::string>> worker_env;
  std::vector<std::pair<std::string, std::string>> server_env;
  std::vector<std::string> command;  // what each process runs
  std::string rendezvous;            // given: use it; empty: serve an embedded store
  std::string run_id;                // empty: made up
  // The processes listen on it (TROUPE_INTERFACE) and the embedded store is served on its address;
  // empty: $TROUPE_INTERFACE, else the route to the first host (loopback for local runs).
  std::string interface;
  std::vector<std::string> ssh_options;  // extra ssh arguments, after $TROUPE_SSH_OPTS
  // File holding the run's secret, which every process reads (TROUPE_SECRET_FILE; with ssh it
  // must exist at that path on every host). Empty: $TROUPE_SECRET, else a fresh random one per
  // run, handed to the processes as TROUPE_SECRET (visible on the ssh or mpirun command line).
  std::string secret_file;
  std::chrono::milliseconds grace{5000};
  std::string on_failure = "abort";  // abort or restart
  int max_restarts = 3;              // restart: starts of the world after the first, at most
  // "MIN:MAX": an elastic run (actors/run/elastic.h; local and ssh launchers). Every process gets
  // TROUPE_NUM_WORKERS=MIN:MAX; a worker that fails is left out and the others go on without it
  // (they re-form, as workers that join later do). The launcher exits 0 when a worker finished
  // the run, else with the code of the last to fail (the one that gave up, naming why). Once a
  // worker finished the run, a local worker that is stopped (SIGSTOP), and any worker still
  // running max(grace, 60 s) later, is ended (SIGTERM and SIGCONT, SIGKILL after the grace
  // period) and named, without changing the exit code: the others went on without it.
  // That is for troupe's own training (troupe train, also inside a wrapper such as sh -c), whose
  // processes re-form; any other command (a script written for torchrun) gets torchrun's elastic
  // model instead (launcher_elastic.cc): this
  // launcher is an agent with its num_workers workers (1 to MAX: the run starts once MIN have
  // come), another started with the same run_id and `rendezvous` joins with its own, and every
  // change of members (a worker failed and is left out, a launcher joins or is gone) stops every
  // worker and starts them again with new ranks; a failure counts against max_restarts.
  std::string elastic;
  // Prints what would start (each process: host, role, rank, variables, command) and starts
  // nothing.
  bool dry_run = false;
  // torchrun's: where a torch.distributed script's rank 0 serves its store (each worker gets
  // MASTER_ADDR and MASTER_PORT, with RANK, LOCAL_RANK, WORLD_SIZE and the rest of torchrun's
  // variables). Empty: worker 0's host (127.0.0.1 for local runs); 0: a free port of this host for
  // local runs, torchrun's 29500 for ssh.
  std::string master_addr;
  int master_port = 0;
};

// Runs the processes to the end. Returns 0 when all exited 0 (in some generation), else the last
// failing process's exit code (128 + signal for a signal; ssh's 255 for a host that cannot be
// reached), after stopping the rest. InputError for bad options or a bad hostfile, IoError when a
// sync fails.
int launch(const LaunchOptions& options);

struct LaunchHost {
  std::string name;
  int port = 0;  // 0: ssh's default
  int line = 0;  // in the hostfile
  // "name" or "name:port".
  std::string display() const;
};

// Reads a hostfile: one `host` or `host:port` a line; `#` starts a comment, blank lines are
// skipped. InputError naming the file (and line) when it cannot be read, is empty or has a bad
// port.
std::vector<LaunchHost> readHostfile(const std::string& path);

// `s` as one POSIX shell word: single-quoted unless it is made only of safe characters.
std::string shellQuote(std::string_view s);

}  // namespace troupe::apps
