#!/usr/bin/env python3
"""Allreduce bandwidth between two hosts: troupe vs PyTorch's gloo vs OpenMPI, in one run.

Two "hosts" from tests/hosts/hosts.sh (network namespaces on a bridge, each with its own /tmp,
/dev/shm and sshd; prefix --prefix, torn down at the end, also on an error or Ctrl-C), one rank
per host, so every byte goes over TCP on the hosts' eth0. For each link rate (`hosts.sh shape I
rate R` on both hosts' egress: tc tbf; "none" = unshaped veth) and each size, in --rounds rounds
that take the tools in turn:
  troupe: `build/bin/troupe bench allreduce -n 2 --worker --interface eth0` started by hand on
          each host (TROUPE_RANK, TROUPE_NUM_WORKERS, TROUPE_RUN_ID, TROUPE_SECRET, and a file://
          rendezvous store in hosts.sh's shared folder); its default chunk copy (send-buffer:
          chunks to another host go from the bucket itself) unless --troupe-args says otherwise.
  gloo:   torch.distributed gloo (GLOO_SOCKET_IFNAME=eth0), .venv-torch's python running this
          script's --gloo-worker mode on each host, timed as bench/allreduce_vs_gloo.py.
  mpi:    OpenMPI MPI_Allreduce, `mpirun --mca btl tcp,self --mca pml ob1 --bind-to none` on host
          0 with a hostfile of both hosts' addresses, its ssh agent logging in through the hosts'
          sshd (hosts.sh ssh-opts); the C program below is built with mpicc at run time.
  tcp:    not an allreduce: the reference. The bytes a 2-rank allreduce sends (each rank S bytes to
          the other while it receives S), over one plain TCP connection, not reduced (tcp_worker).
All three: float32 sum, 1 MB = 1e6 bytes, --warmup untimed then --iters timed allreduces per
size, each one after a barrier, sums checked; time = the slowest rank's mean over the timed
iterations; busbw = size / time * 2(n-1)/n (= size / time at n = 2, which is the bytes each rank
sends one way, so 1 Gbit/s of line is 0.125 GB/s of busbw). A cell is the median over rounds of
the per-round value, [min-max] over rounds; ratios are ratios of the medians. Rates below 2 Gbit/s
use --slow-iters/--slow-warmup. Also printed: the busbw of the fastest single iteration (median over
rounds), and CPU use while each tool ran: the machine's CPUs (/proc/stat, other work included) and
host 0's process (its rank 0; mpi: mpirun with its local rank), from its rusage.

    flock /tmp/troupe-build.lock ninja -C build -j2 troupe_cli   # build/bin/troupe
    apt-get install -y libopenmpi-dev                             # mpicc, mpirun (if missing)
    sudo python3 bench/allreduce_hosts.py [--rates none,1gbit,10gbit] [--sizes 1,25,100]
        [--iters 20] [--warmup 5] [--slow-iters 10] [--slow-warmup 3] [--rounds 3]
        [--tools troupe,gloo,mpi,tcp] [--troupe-args="--copy alloc"] [--prefix bh]
(.venv-torch is made with torch==2.15.0 from PyPI if it lacks torch.)
"""
import argparse
import os
import re
import secrets
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import time

from gloo_timing import PERIOD, timed_allreduces  # troupe bench's inputs and timing

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HOSTS_SH = os.path.join(ROOT, "tests/hosts/hosts.sh")
VENV = os.path.join(ROOT, ".venv-torch")
VENV_PY = os.path.join(VENV, "bin/python")
TORCH_VERSION = "2.15.0"
WORLD = 2
TOOLS = ("troupe", "gloo", "mpi")
CEILING = "tcp"  # not an allreduce: the bytes of one over a plain socket, for troupe / that

# One MPI rank: the same convention as troupe's bench and the gloo worker. Rank 0 prints one line
# per size: "MB COUNT MEAN_MS MIN_MS WRONG" (slowest rank's mean, fastest rank's fastest iteration).
MPI_SOURCE = r"""
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank, world;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  if (argc != 4) {
    if (rank == 0) fprintf(stderr, "usage: SIZES WARMUP ITERS\n");
    MPI_Abort(MPI_COMM_WORLD, 2);
  }
  char sizes[1024]; snprintf(sizes, sizeof sizes, "%s", argv[1]);
  int warmup = atoi(argv[2]), iters = atoi(argv[3]);
  for (char* tok = strtok(sizes, ","); tok; tok = strtok(NULL, ",")) {
    double mb = atof(tok);
    long n = (long)(mb * 1e6 / 4 + 0.5); if (n < 1) n = 1;
    float* in = malloc(n * 4); float* out = malloc(n * 4);
    for (long i = 0; i < n; ++i) in[i] = (float)(rank + 1) + (float)(i % PERIOD);
    double sum = 0, mn = 1e30; long wrong = 0;
    for (int it = 0; it < warmup + iters; ++it) {
      MPI_Barrier(MPI_COMM_WORLD);
      double t0 = MPI_Wtime();
      MPI_Allreduce(in, out, (int)n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
      double t = MPI_Wtime() - t0;
      if (it >= warmup) { sum += t; if (t < mn) mn = t; }
      for (long i = 0; i < n; ++i)
        wrong += out[i] != (float)(world * (world + 1) / 2) + (float)world * (float)(i % PERIOD);
    }
    double mean = sum / iters, tmax, tmin; long bad;
    MPI_Reduce(&mean, &tmax, 1, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);
    MPI_Reduce(&mn, &tmin, 1, MPI_DOUBLE, MPI_MIN, 0, MPI_COMM_WORLD);
    MPI_Reduce(&wrong, &bad, 1, MPI_LONG, MPI_SUM, 0, MPI_COMM_WORLD);
    if (rank == 0) printf("%s %ld %.6f %.6f %ld\n", tok, n, tmax * 1e3, tmin * 1e3, bad);
    fflush(stdout);
    free(in); free(out);
  }
  MPI_Finalize();
  return 0;
}
""".replace("PERIOD", str(PERIOD))


# --- the gloo worker (runs on a host, under .venv-torch's python) -------------------------------

def gloo_worker(rank, master, sizes_mb, warmup, iters):
    import torch
    import torch.distributed as dist
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=master, rank=rank, world_size=WORLD)
    world = dist.get_world_size()
    for mb in sizes_mb:
        count = max(1, round(mb * 1e6 / 4))
        times, wrong = timed_allreduces(torch, dist, rank, world, count, warmup, iters)
        # [mean, -fastest]: MAX gives the slowest rank's mean and the fastest rank's fastest.
        t = torch.tensor([sum(times) / len(times), -min(times)], dtype=torch.float64)
        bad = torch.tensor([wrong], dtype=torch.int64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        dist.all_reduce(bad, op=dist.ReduceOp.SUM)
        if rank == 0:
            print(f"{mb:g} {count} {t[0].item() * 1e3:.6f} {-t[1].item() * 1e3:.6f} "
                  f"{int(bad.item())}", flush=True)
    dist.barrier()
    dist.destroy_process_group()


# --- the ceiling: the bytes of an allreduce, moved without reducing ---------------------------------

def tcp_worker(rank, peer, sizes_mb, warmup, iters):
    """At n = 2 a ring allreduce of S bytes sends S bytes each way (half in its reduce-scatter,
    half in its all-gather) and adds S/2 bytes. Here each rank sends S bytes to the other while
    it receives S bytes, over one TCP connection (TCP_NODELAY, Linux's buffer autotuning), with
    no reduction and no copy but the kernel's: what a plain socket carries of an allreduce's bytes
    on the link, the reference for troupe's path (not a hard bound: a tuned path can beat
    Python's one connection by a little).
    Timed as the allreduces: after a one-byte barrier, `warmup` untimed then `iters` timed;
    rank 0 prints "MB COUNT MEAN_MS MIN_MS WRONG" (slowest rank's mean; WRONG counts exchanges
    whose received bytes differ from what the peer sent)."""
    import socket
    import struct
    import threading
    host, port = peer.rsplit(":", 1)
    if rank == 0:
        server = socket.socket()
        server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        server.bind(("0.0.0.0", int(port)))
        server.listen(1)
        conn, _ = server.accept()
    else:
        deadline = time.time() + 60
        while True:
            try:
                conn = socket.create_connection((host, int(port)))
                break
            except OSError:
                if time.time() > deadline:
                    raise
                time.sleep(0.05)
    conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def recv_exactly(view):
        got = 0
        while got < len(view):
            n = conn.recv_into(view[got:], min(len(view) - got, 1 << 22))
            if n == 0:
                raise ConnectionError("the peer closed the connection")
            got += n

    one = bytearray(1)
    for mb in sizes_mb:
        size = max(4, round(mb * 1e6 / 4) * 4)
        mine = bytes((rank + 1 + i) % 251 for i in range(251)) * (size // 251 + 1)
        mine = memoryview(mine)[:size]
        theirs_expected = bytes((2 - rank + i) % 251 for i in range(251)) * (size // 251 + 1)
        buf = bytearray(size)
        times, wrong = [], 0
        for it in range(warmup + iters):
            conn.sendall(b"b")
            recv_exactly(memoryview(one))
            start = time.perf_counter()
            sender = threading.Thread(target=conn.sendall, args=(mine,))
            sender.start()
            recv_exactly(memoryview(buf))
            sender.join()
            elapsed = time.perf_counter() - start
            if it >= warmup:
                times.append(elapsed)
            wrong += buf != theirs_expected[:size]
        mean, fastest = sum(times) / len(times), min(times)
        conn.sendall(struct.pack("!ddq", mean, fastest, wrong))
        other = bytearray(24)
        recv_exactly(memoryview(other))
        o_mean, o_fastest, o_wrong = struct.unpack("!ddq", other)
        if rank == 0:
            print(f"{mb:g} {size // 4} {max(mean, o_mean) * 1e3:.6f} "
                  f"{min(fastest, o_fastest) * 1e3:.6f} {wrong + o_wrong}", flush=True)
    conn.close()


# --- the two hosts -------------------------------------------------------------------------------

class ToolError(Exception):
    pass


def interrupt_on_termination():
    """SIGTERM and SIGHUP interrupt like Ctrl-C (KeyboardInterrupt), so that the hosts come down."""
    def interrupted(signum, frame):
        raise KeyboardInterrupt(f"signal {signum}")
    signal.signal(signal.SIGTERM, interrupted)
    signal.signal(signal.SIGHUP, interrupted)


def take_down(hosts):
    """hosts.down(), with Ctrl-C ignored meanwhile so that the teardown finishes."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    hosts.down()
    signal.signal(signal.SIGINT, signal.SIG_DFL)


class Measuring:
    """`with Measuring(hosts) as run:` around a benchmark's work on the hosts: Ctrl-C and a
    ToolError end the block with one line and set run.code (130, 1); the hosts come down however
    the block ends."""

    def __init__(self, hosts):
        self.hosts, self.code = hosts, None

    def __enter__(self):
        return self

    def __exit__(self, kind, error, traceback):
        try:
            if kind is KeyboardInterrupt:
                print("# interrupted", file=sys.stderr)
                self.code = 130
            elif kind is not None and issubclass(kind, ToolError):
                print(f"# {error}", file=sys.stderr)
                self.code = 1
        finally:
            if self.hosts is not None:
                take_down(self.hosts)
        return self.code is not None


class Hosts:
    def __init__(self, prefix, subnet, count=None):
        # WORLD is read here, not where the default is written: a caller may set it first.
        self.prefix, self.subnet, self.count = prefix, subnet, count or WORLD
        self.made = False
        self.children = []  # Popen objects still to reap

    def sh(self, *args, check=True):
        cmd = ["bash", HOSTS_SH, *args, "--prefix", self.prefix]
        run = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        if check and run.returncode != 0:
            raise ToolError(f"{' '.join(cmd)} failed ({run.returncode}):\n{run.stdout}")
        return run.stdout.strip()

    def up(self):
        self.sh("gc", check=False)  # instances whose owner died (a killed earlier run)
        if os.path.exists(self.sh("dir")):
            raise ToolError(f"hosts of prefix {self.prefix} exist already (another run?): "
                            f"{HOSTS_SH} down --prefix {self.prefix}, or pick another --prefix")
        self.made = True  # from here on, `down` must run whatever happens
        out = self.sh("up", str(self.count), "--subnet", self.subnet, "--owner", str(os.getpid()))
        self.addr = [self.sh("addr", str(i)) for i in range(self.count)]
        self.shared = self.sh("shared")
        self.ssh_opts = self.sh("ssh-opts")
        return out

    def shape(self, i, rate):
        if rate == "none":
            return self.sh("shape", str(i), "clear")
        return self.sh("shape", str(i), "rate", rate)

    def start(self, i, env, cmd, log, cwd=ROOT):
        """Starts CMD on host I, in CWD, with the environment ENV (K=V, on top of this one's),
        output to the file LOG. hosts.sh, nsenter and env exec, so the process is CMD itself."""
        full = ["bash", HOSTS_SH, "exec", str(i), "--prefix", self.prefix, "--cwd", cwd, "--",
                "env", *[f"{k}={v}" for k, v in env.items()], *cmd]
        with open(log, "w") as out:
            p = subprocess.Popen(full, stdin=subprocess.DEVNULL, stdout=out,
                                 stderr=subprocess.STDOUT)
        p.log, p.t0, p.cpu, p.wall = log, time.monotonic(), None, None
        self.children.append(p)
        return p

    def kill_children(self):
        for p in self.children:
            if p.poll() is None:
                p.kill()
        for p in self.children:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
        self.children = []

    def down(self):
        self.kill_children()
        if self.made:
            self.made = False
            print(f"# tearing down hosts of prefix {self.prefix}", file=sys.stderr, flush=True)
            out = self.sh("down", check=False)
            if out:
                print(out, file=sys.stderr)


def tail(path, lines=15):
    try:
        with open(path) as f:
            return "".join(f.readlines()[-lines:])
    except OSError:
        return "(no log)"


def reap(p):
    """Popen.poll() that also keeps the CPU seconds (user + system, its threads and the children
    it waited for) and the wall seconds of a process that ended."""
    if p.returncode is None:
        pid, status, usage = os.wait4(p.pid, os.WNOHANG)
        if pid:
            p.returncode = os.waitstatus_to_exitcode(status)
            p.cpu, p.wall = usage.ru_utime + usage.ru_stime, time.monotonic() - p.t0
    return p.returncode


def wait_all(procs, timeout, name):
    """Waits for every process; on a failure or the timeout kills the rest and raises ToolError
    with their logs."""
    deadline = time.monotonic() + timeout
    failed = None
    while True:
        codes = [reap(p) for p in procs]
        if all(c is not None for c in codes):
            break
        bad = [p for p, c in zip(procs, codes) if c not in (None, 0)]
        if bad and failed is None:
            failed = time.monotonic()  # give the others 10 s to notice and exit by themselves
        if time.monotonic() > deadline or (failed and time.monotonic() - failed > 10):
            for p in procs:
                if reap(p) is None:
                    p.kill()
            for p in procs:
                p.wait()
            why = f"timed out after {timeout:.0f} s" if not failed else "a rank failed"
            raise ToolError(f"{name}: {why}:\n" + "\n".join(
                f"--- {p.log} (exit {p.returncode}):\n{tail(p.log)}" for p in procs))
        time.sleep(0.1)
    if any(p.returncode for p in procs):
        raise ToolError(f"{name} failed:\n" + "\n".join(
            f"--- {p.log} (exit {p.returncode}):\n{tail(p.log)}" for p in procs))


def parse_rows(text, sizes_mb, name):
    """Lines "MB COUNT MEAN_MS MIN_MS WRONG" -> {mb: (busbw, best_busbw)}."""
    out = {}
    for line in text.splitlines():
        f = line.split()
        if len(f) != 5 or not re.fullmatch(r"[0-9.e+-]+", f[0]):
            continue
        mb, count, mean_ms, min_ms, wrong = float(f[0]), int(f[1]), float(f[2]), float(f[3]), \
            int(f[4])
        if wrong:
            raise ToolError(f"{name}: {wrong} wrong sums at {mb:g} MB")
        factor = 2 * (WORLD - 1) / WORLD
        out[mb] = (count * 4 / (mean_ms * 1e-3) / 1e9 * factor,
                   count * 4 / (min_ms * 1e-3) / 1e9 * factor)
    missing = [mb for mb in sizes_mb if mb not in out]
    if missing:
        raise ToolError(f"{name}: no result for {missing} MB in:\n{text}")
    return out


def cpu_times():
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:9]]
    return sum(v), v[3] + v[4]  # total, idle + iowait


class Bench:
    def __init__(self, a, hosts, troupe, mpi_binary):
        self.a, self.hosts, self.troupe, self.mpi_binary = a, hosts, troupe, mpi_binary
        self.sizes_arg = ",".join(f"{mb:g}" for mb in a.sizes_mb)
        self.counter = 0

    def workdir(self, name):
        self.counter += 1
        d = os.path.join(self.hosts.shared, f"{self.counter:03d}-{name}")
        os.makedirs(d)
        return d

    def timeout(self, rate_bps, warmup, iters):
        # generous: a tenth of the line rate (or 0.05 GB/s unshaped) and startup time
        bw = 0.05e9 if rate_bps is None else rate_bps / 10
        return 120 + (warmup + iters) * sum(self.a.sizes_mb) * 1e6 / bw

    def run_troupe(self, warmup, iters, timeout):
        d = self.workdir("troupe")
        run_id = os.path.basename(d)
        results = os.path.join(d, "results.txt")
        env = {"TROUPE_NUM_WORKERS": WORLD, "TROUPE_RUN_ID": f"bh{run_id}",
               "TROUPE_RENDEZVOUS": f"file://{d}/store", "TROUPE_SECRET": secrets.token_hex(16)}
        cmd = [self.troupe, "bench", "allreduce", "-n", str(WORLD), "--sizes", self.sizes_arg,
               "--iters", str(iters), "--warmup", str(warmup), "--worker", "--results", results,
               "--interface", "eth0"] + self.a.troupe_extra
        procs = [self.hosts.start(r, {**env, "TROUPE_RANK": r}, cmd, f"{d}/rank{r}.log")
                 for r in reversed(range(WORLD))]
        wait_all(procs, timeout, "troupe")
        self.host0 = procs[-1]
        with open(results) as f:
            return parse_rows(f.read(), self.a.sizes_mb, "troupe")

    def run_gloo(self, warmup, iters, timeout):
        d = self.workdir("gloo")
        port = 29500 + self.counter % 1000
        master = f"tcp://{self.hosts.addr[0]}:{port}"
        env = {"GLOO_SOCKET_IFNAME": "eth0", "OMP_NUM_THREADS": 1}
        procs = [self.hosts.start(r, env, [VENV_PY, os.path.abspath(__file__), "--gloo-worker",
                                           str(r), master, "--sizes", self.sizes_arg,
                                           "--warmup", str(warmup), "--iters", str(iters)],
                                  f"{d}/rank{r}.log")
                 for r in reversed(range(WORLD))]
        wait_all(procs, timeout, "gloo")
        self.host0 = procs[-1]
        with open(procs[-1].log) as f:  # rank 0 is started last
            return parse_rows(f.read(), self.a.sizes_mb, "gloo")

    def run_mpi(self, warmup, iters, timeout):
        d = self.workdir("mpi")
        hostfile = os.path.join(d, "hostfile")
        with open(hostfile, "w") as f:
            f.writelines(f"{addr} slots=1\n" for addr in self.hosts.addr)
        subnet = f"{self.hosts.subnet}.0/24"
        cmd = ["mpirun", "--allow-run-as-root", "-np", str(WORLD), "--hostfile", hostfile,
               "--map-by", "node", "--bind-to", "none",
               "--mca", "plm_rsh_agent", "ssh", "--mca", "plm_rsh_args", self.hosts.ssh_opts,
               "--mca", "btl", "tcp,self", "--mca", "pml", "ob1",
               "--mca", "btl_tcp_if_include", subnet, "--mca", "oob_tcp_if_include", subnet,
               self.mpi_binary, self.sizes_arg, str(warmup), str(iters)]
        p = self.hosts.start(0, {}, cmd, f"{d}/mpirun.log")
        wait_all([p], timeout, "mpi")
        self.host0 = p
        with open(p.log) as f:
            return parse_rows(f.read(), self.a.sizes_mb, "mpi")

    def run_tcp(self, warmup, iters, timeout):
        d = self.workdir("tcp")
        peer = f"{self.hosts.addr[0]}:{29500 + self.counter % 1000}"
        procs = [self.hosts.start(r, {}, [sys.executable, os.path.abspath(__file__),
                                          "--tcp-worker", str(r), peer, "--sizes", self.sizes_arg,
                                          "--warmup", str(warmup), "--iters", str(iters)],
                                  f"{d}/rank{r}.log")
                 for r in range(WORLD)]  # rank 0 listens first
        wait_all(procs, timeout, "tcp")
        self.host0 = procs[0]
        with open(procs[0].log) as f:
            return parse_rows(f.read(), self.a.sizes_mb, "tcp")

    def run(self, tool, rate_bps, warmup, iters):
        """{mb: (busbw, best)} and (the machine's CPUs' busy fraction while it ran, host 0's
        process's CPU seconds per second), or None, None on a failure."""
        fn = {"troupe": self.run_troupe, "gloo": self.run_gloo, "mpi": self.run_mpi,
              CEILING: self.run_tcp}[tool]
        t0, i0 = cpu_times()
        try:
            rows = fn(warmup, iters, self.timeout(rate_bps, warmup, iters))
        except ToolError as e:
            print(f"# FAILED: {e}", file=sys.stderr, flush=True)
            return None, None
        t1, i1 = cpu_times()
        return rows, (1 - (i1 - i0) / max(1, t1 - t0), self.host0.cpu / self.host0.wall)


# --- set-up --------------------------------------------------------------------------------------

def rate_bps(rate):
    """'1gbit' -> 1.25e8 bytes/s; 'none' -> None."""
    if rate == "none":
        return None
    m = re.fullmatch(r"([0-9]+(?:\.[0-9]+)?)(k|m|g)bit", rate)
    if not m:
        sys.exit(f"--rates: bad rate '{rate}' (none, or e.g. 1gbit, 10gbit, 500mbit)")
    return float(m.group(1)) * {"k": 1e3, "m": 1e6, "g": 1e9}[m.group(2)] / 8


def ensure_torch():
    # numpy too: troupe's Python module (build/python) reads and writes numpy arrays.
    check = [VENV_PY, "-c", "import numpy, torch, torch.distributed as d; "
             "assert d.is_gloo_available(); print(torch.__version__)"]
    if os.path.exists(VENV_PY):
        r = subprocess.run(check, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        if r.returncode == 0:
            return r.stdout.strip()
    print(f"# installing the peer: torch=={TORCH_VERSION} into {VENV} (about 5 GB)", flush=True)
    subprocess.run([sys.executable, "-m", "venv", VENV], check=True)
    subprocess.run([os.path.join(VENV, "bin/pip"), "install", f"torch=={TORCH_VERSION}", "numpy"],
                   check=True)
    return subprocess.run(check, stdout=subprocess.PIPE, text=True, check=True).stdout.strip()


def build_mpi(shared):
    src, binary = os.path.join(shared, "mpi_allreduce.c"), os.path.join(shared, "mpi_allreduce")
    with open(src, "w") as f:
        f.write(MPI_SOURCE)
    subprocess.run(["mpicc", "-O2", "-o", binary, src], check=True)
    return binary


def run_ranks(hosts, world, cmd, logs, port, timeout=1800, what="ranks"):
    """CMD as ranks 0 .. WORLD-1 of a world as torchrun starts one, rank r on host r (its log
    LOGS[r]): RANK, WORLD_SIZE, LOCAL_RANK 0, LOCAL_WORLD_SIZE 1, MASTER_ADDR host 0's,
    MASTER_PORT PORT, GLOO_SOCKET_IFNAME eth0, build/python on PYTHONPATH; rank 0, whose store the
    others wait for, last. Waits for them all (wait_all); a ToolError starts with the first
    "what():" line of their logs."""
    procs = []
    for r in reversed(range(world)):
        env = {"RANK": r, "WORLD_SIZE": world, "LOCAL_RANK": 0, "LOCAL_WORLD_SIZE": 1,
               "MASTER_ADDR": hosts.addr[0], "MASTER_PORT": port, "GLOO_SOCKET_IFNAME": "eth0",
               "PYTHONPATH": os.path.join(ROOT, "build/python")}
        procs.append(hosts.start(r, env, cmd, logs[r]))
    try:
        wait_all(procs, timeout, what)
    except ToolError as e:
        first = ""
        for log in logs:
            with open(log, errors="replace") as f:
                first = first or next((line for line in f if "what():" in line), "")
        raise ToolError(f"{what}: {first.strip() or 'a rank failed'}\n{e}") from e


def cell(values, digits=3):
    if not values:
        return "-"
    return (f"{statistics.median(values):.{digits}f} "
            f"[{min(values):.{digits}f}-{max(values):.{digits}f}]")


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--troupe", default=os.path.join(ROOT, "build/bin/troupe"))
    p.add_argument("--rates", default="none,1gbit,10gbit",
                   help="link rates (tc tbf on every host's egress); none = unshaped")
    p.add_argument("--sizes", default="1,25,100", help="MB (1e6 bytes)")
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--slow-iters", type=int, default=10, help="--iters for rates below 2 Gbit/s")
    p.add_argument("--slow-warmup", type=int, default=3, help="--warmup for rates below 2 Gbit/s")
    p.add_argument("--rounds", type=int, default=3, help="rounds, each running every tool once")
    p.add_argument("--tools", default=",".join(TOOLS + (CEILING,)))
    p.add_argument("--troupe-args", default="", help="more flags for troupe bench allreduce")
    p.add_argument("--prefix", default="bh", help="hosts.sh prefix of this run's hosts")
    p.add_argument("--subnet", default="10.79.0", help="hosts.sh subnet A.B.C")
    p.add_argument("--gloo-worker", nargs=2, metavar=("RANK", "MASTER"), help=argparse.SUPPRESS)
    p.add_argument("--tcp-worker", nargs=2, metavar=("RANK", "PEER"), help=argparse.SUPPRESS)
    a = p.parse_args()
    a.sizes_mb = [float(s) for s in a.sizes.split(",")]
    if a.gloo_worker:
        gloo_worker(int(a.gloo_worker[0]), a.gloo_worker[1], a.sizes_mb, a.warmup, a.iters)
        return 0
    if a.tcp_worker:
        tcp_worker(int(a.tcp_worker[0]), a.tcp_worker[1], a.sizes_mb, a.warmup, a.iters)
        return 0
    a.troupe_extra = shlex.split(a.troupe_args)
    tools = a.tools.split(",")
    if any(t not in TOOLS + (CEILING,) for t in tools):
        sys.exit(f"--tools: want some of {','.join(TOOLS + (CEILING,))}")
    rates = a.rates.split(",")
    line = {r: rate_bps(r) for r in rates}

    if os.geteuid() != 0:
        sys.exit("must run as root (hosts.sh makes network namespaces, bridges and mounts)")
    if not os.access(a.troupe, os.X_OK):
        sys.exit(f"{a.troupe} is missing: flock /tmp/troupe-build.lock ninja -C build -j2 "
                 "troupe_cli")
    if "mpi" in tools and not (shutil.which("mpicc") and shutil.which("mpirun")):
        sys.exit("mpicc/mpirun are missing: apt-get install -y libopenmpi-dev")
    torch_version = ensure_torch() if "gloo" in tools else "-"

    interrupt_on_termination()

    hosts = Hosts(a.prefix, a.subnet)
    results = {}  # (rate, tool, mb) -> [(busbw, best)]
    cpu = {}  # (rate, tool) -> [the machine's busy fraction]
    cpu0 = {}  # (rate, tool) -> [host 0's process's CPU seconds per second]
    failures = 0
    with Measuring(hosts) as run:
        print(hosts.up(), file=sys.stderr, flush=True)
        mpi_binary = build_mpi(hosts.shared) if "mpi" in tools else None
        bench = Bench(a, hosts, a.troupe, mpi_binary)
        print(f"# allreduce float32 sum, 2 hosts x 1 rank ({' '.join(hosts.addr)}, eth0 over a "
              f"bridge), {os.cpu_count()} CPUs on the machine; torch {torch_version}; troupe "
              f"flags: {' '.join(a.troupe_extra) or '(default: --copy send-buffer)'}; mpi: "
              f"--mca btl tcp,self --bind-to none", flush=True)
        for rate in rates:
            for i in range(WORLD):
                print(f"# {hosts.shape(i, rate)}", file=sys.stderr, flush=True)
            slow = line[rate] is not None and line[rate] < 2e9 / 8
            warmup, iters = (a.slow_warmup, a.slow_iters) if slow else (a.warmup, a.iters)
            for r in range(a.rounds):
                with open("/proc/loadavg") as f:
                    load = " ".join(f.read().split()[:3])
                print(f"# rate {rate}: round {r + 1}/{a.rounds}, {warmup} warm-up + {iters} timed "
                      f"iterations, load average {load}", file=sys.stderr, flush=True)
                for tool in tools:
                    rows, busy = bench.run(tool, line[rate], warmup, iters)
                    if rows is None:
                        failures += 1
                        continue
                    cpu.setdefault((rate, tool), []).append(busy[0])
                    cpu0.setdefault((rate, tool), []).append(busy[1])
                    for mb, v in rows.items():
                        results.setdefault((rate, tool, mb), []).append(v)
                    print(f"#   {tool:6s} " + "  ".join(
                        f"{mb:g} MB {bw:.3f} (best {best:.3f})" for mb, (bw, best) in
                        rows.items()) + f"  GB/s; CPUs {100 * busy[0]:.0f}% busy, host 0's "
                        f"process {100 * busy[1]:.0f}% of a core",
                        file=sys.stderr, flush=True)
    if run.code is not None:
        return run.code

    def get(rate, tool, mb, k=0):
        return [v[k] for v in results.get((rate, tool, mb), [])]

    def med(values):
        return statistics.median(values) if values else float("nan")

    def ratio(x, y):
        return f"{x / y:.2f}x" if x == x and y == y else "-"  # x == x: not nan

    print(f"\n# busbw in GB/s: median over {a.rounds} rounds of each round's mean over the timed "
          f"iterations, [min-max] over rounds; ratios of the medians; line = troupe's busbw / the "
          f"line rate's (rate/8; busbw = bytes each rank sends one way at n = 2)")
    w = 21
    print("# tcp: not an allreduce but its bytes moved without reducing, each rank sending and "
          "receiving S at once over one plain connection (tcp_worker); t/tcp = troupe / that")
    print(f"{'rate':>7} {'MB':>5} {'troupe':>{w}} {'gloo':>{w}} {'mpi':>{w}} {'tcp':>{w}} "
          f"{'t/gloo':>7} {'t/mpi':>6} {'t/tcp':>6} {'t/line':>7}")
    for rate in rates:
        for mb in a.sizes_mb:
            t, g, m, c = (get(rate, tool, mb) for tool in TOOLS + (CEILING,))
            frac = f"{med(t) / (line[rate] / 1e9):.0%}" if line[rate] and t else "-"
            print(f"{rate:>7} {mb:>5g} {cell(t):>{w}} {cell(g):>{w}} {cell(m):>{w}} "
                  f"{cell(c):>{w}} {ratio(med(t), med(g)):>7} {ratio(med(t), med(m)):>6} "
                  f"{ratio(med(t), med(c)):>6} {frac:>7}")
    print("\n# busbw of the fastest iteration, GB/s (median over rounds)")
    print(f"{'rate':>7} {'MB':>5} {'troupe':>8} {'gloo':>8} {'mpi':>8} {'tcp':>8}")
    for rate in rates:
        for mb in a.sizes_mb:
            print(f"{rate:>7} {mb:>5g} " + " ".join(
                f"{med(get(rate, tool, mb, 1)):>8.3f}" for tool in TOOLS + (CEILING,)))
    print(f"\n# CPU, % (median [min-max] over rounds) over each tool's whole run (all sizes, "
          f"start-up and warm-up included): 'machine' = all {os.cpu_count()} CPUs busy (other "
          f"sessions' work included); 'host0' = host 0's process (troupe's or gloo's rank 0; "
          f"mpi: mpirun with its local rank 0), CPU seconds per second, 100 = one core")
    print(f"{'rate':>7} " + " ".join(f"{tool + ' ' + what:>19}" for tool in TOOLS
                                     for what in ("machine", "host0")))
    for rate in rates:
        print(f"{rate:>7} " + " ".join(
            f"{cell([100 * x for x in d.get((rate, tool), [])], 0):>19}" for tool in TOOLS
            for d in (cpu, cpu0)))
    if failures:
        print(f"\n# {failures} tool run(s) failed (their errors are above, on stderr)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
