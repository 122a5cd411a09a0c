#!/usr/bin/env python3
"""Chaos run: `troupe launch --on-failure restart` against workers killed with SIGKILL or hung.

Trains one uninterrupted baseline, then `--runs` runs of the same config, each with `--faults`
faults: at a random moment of a generation (uniform in [--min-delay, --max-delay] seconds after its
workers started) a random worker gets SIGKILL (`--fault kill`), or SIGSTOP (`--fault stop`: the
process hangs with its sockets open, which its peers cannot tell from a cut link; they must notice
through the heartbeats within --peer-timeout and fail naming it), or either at random (`mixed`).
The launcher must stop the others, start them all again, and the new generation must resume from
the newest checkpoint. Checks, per run:

  completed   the launcher exited 0 and the CSV logs hold the last epoch
  accuracy    the last epoch's test accuracy is within --tolerance of the baseline's
  data lost   a checkpoint in the folder does not load (magic, version, CRC-32), or a generation
              resumed from an earlier step than the newest checkpoint written before the kill

and prints a table, then a summary line: faults injected, runs, runs completed, data lost.
With --scenarios, the faults of issue 10 instead, each --runs times, in short runs
(--scenario-epochs): a socket folder planted before the run (planted-folder), a second run with
the same run id and secret (colliding-run), 300 strangers connecting to a worker limited to 256
descriptors (descriptor-exhaustion), the launcher's output left unread while a worker is killed
(stalled-launcher-output), a SIGSTOPped parameter server (stopped-server); and those of issue 33:
the launcher itself SIGSTOPped past the peer timeout while its workers log every step
(stopped-launcher), two ranks started by hand with other learning rates (hyperparameter-mismatch),
garbage connections to the run's store during the run (refusal-flood), and in elastic runs a joiner
killed as it starts, while the run pauses for it or once admitted (elastic-joiner-killed-*), a
client that forges a joiner's round in the store (elastic-liar) and a stopped member
(elastic-stopped-member). Each must complete (or stop with a clear error), lose nothing, and leave
no process; a table says so.

Python 3 standard library only. Example (from the repository root, after scripts/build.sh and the
test data, `ctest -R setup_fashion_mnist`):

  python3 bench/chaos.py --runs 3 --faults 3
  python3 bench/chaos.py --scenarios all --runs 2
"""

import argparse
import os
import random
import re
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
import zlib

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MAGIC = b"TROUPECK"


def load_checkpoint_meta(path):
    """The meta of a troupe checkpoint (actors/run/checkpoint.cc), after checking it whole; raises
    ValueError naming what is wrong."""
    with open(path, "rb") as f:
        data = f.read()
    if len(data) < 24 or data[:8] != MAGIC:
        raise ValueError("not a troupe checkpoint")
    (stored,) = struct.unpack("<I", data[-4:])
    if zlib.crc32(data[:-4]) & 0xFFFFFFFF != stored:
        raise ValueError("checksum mismatch")
    (version,) = struct.unpack("<I", data[8:12])
    if version != 1:
        raise ValueError("version %d" % version)
    (meta_size,) = struct.unpack("<Q", data[12:20])
    meta = {}
    for line in data[20:20 + meta_size].decode().splitlines():
        key, _, value = line.partition("=")
        meta[key] = value
    return meta


def checkpoints(folder):
    """[(step, path, error)] of every *.ckpt in folder; error is None for a complete one."""
    out = []
    if not os.path.isdir(folder):
        return out
    for name in sorted(os.listdir(folder)):
        if not name.endswith(".ckpt"):
            continue
        path = os.path.join(folder, name)
        try:
            out.append((int(load_checkpoint_meta(path)["step"]), path, None))
        except (OSError, ValueError, KeyError) as e:
            out.append((-1, path, str(e)))
    return out


def newest_step(folder):
    steps = [step for step, _, error in checkpoints(folder) if error is None]
    return max(steps) if steps else 0


def last_epoch_row(folder):
    """(epoch, test_accuracy) of the highest epoch in the CSV logs of folder, or (0, None)."""
    best = (0, None)
    for name in os.listdir(folder):
        if not name.endswith(".log"):
            continue
        with open(os.path.join(folder, name)) as f:
            lines = f.read().splitlines()
        for line in lines[2:]:
            cells = line.split(",")
            if len(cells) >= 11 and int(cells[7]) >= best[0]:
                best = (int(cells[7]), float(cells[10]))
    return best


def run_processes(run_id, role="worker", generation=None):
    """{pid: rank} of the live troupe processes of the run (read from /proc/*/environ)."""
    found = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open("/proc/%s/comm" % entry) as f:
                if f.read().strip() != "troupe":
                    continue
            with open("/proc/%s/environ" % entry, "rb") as f:
                env = dict(kv.split(b"=", 1) for kv in f.read().split(b"\0") if b"=" in kv)
            with open("/proc/%s/stat" % entry) as f:
                if f.read().rsplit(")", 1)[1].split()[0] == "Z":
                    continue
        except (OSError, IndexError, ValueError):
            continue
        if env.get(b"TROUPE_RUN_ID") != run_id.encode():
            continue
        if env.get(b"TROUPE_ROLE") != role.encode():
            continue
        if generation is not None and env.get(b"TROUPE_GENERATION") != str(generation).encode():
            continue
        found[int(entry)] = int(env.get(b"TROUPE_RANK", b"-1"))
    return found


class Launch:
    """One `troupe launch`, its output collected by a thread."""

    def __init__(self, args, folder, run_id, restart, servers=None, schedule=None,
                 secret_file=None, read_output=True, epochs=None, log_every=0):
        servers = args.servers if servers is None else servers
        command = [args.troupe, "launch", "-n", str(args.workers), "--launcher", "local",
                   "--run_id", run_id]
        if servers:
            command += ["-s", str(servers)]
        if secret_file:
            command += ["--secret-file", secret_file]
        if restart:
            command += ["--on-failure", "restart", "--max-restarts", str(args.faults + 2)]
        data = args.data
        command += ["--", "troupe", "train", "--model", args.model,
                    "--train_data", data + "/train", "--test_data", data + "/test",
                    "--db_type", "lmdb", "--schedule", schedule or args.schedule,
                    "--num_epochs", str(epochs or args.epochs), "--epoch_size",
                    str(args.epoch_size),
                    "--batch_size", str(args.batch_size),
                    "--base_learning_rate", str(args.learning_rate),
                    "--checkpoint_every", "1", "--log_every", str(log_every), "--threads", "1",
                    "--peer_timeout", str(args.peer_timeout),
                    "--stall_warning", str(max(0.5, args.peer_timeout / 2))]
        self.lines = []
        self.started = time.monotonic()
        self.process = subprocess.Popen(command, cwd=folder, stdout=subprocess.PIPE,
                                        stderr=subprocess.STDOUT, text=True)
        self.reading = threading.Event()
        if read_output:
            self.reading.set()
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self):
        self.reading.wait()  # until then nobody reads the launcher's output: its pipe fills
        for line in self.process.stdout:
            self.lines.append(line.rstrip("\n"))

    def running(self):
        return self.process.poll() is None

    def wait(self, timeout):
        self.reading.set()
        try:
            code = self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.process.send_signal(signal.SIGTERM)
            code = self.process.wait()
            self.lines.append("[chaos] launcher timed out after %.0f s" % timeout)
        self.reader.join()
        return code

    def resumed_steps(self):
        """{generation: step it resumed from (0: from scratch)}, from worker 0's lines."""
        out, generation = {}, 0
        restart = re.compile(r"^\[launcher\] run \S+ \(restart (\d+) of")
        resumed = re.compile(r"^\[worker 0\] .* resuming from \S+ at step (\d+)")
        scratch = re.compile(r"^\[worker 0\] .* starting from scratch")
        for line in self.lines:
            m = restart.match(line)
            if m:
                generation = int(m.group(1))
                continue
            m = resumed.match(line)
            if m:
                out[generation] = int(m.group(1))
            elif scratch.match(line):
                out[generation] = 0
        return out


def chaos_run(args, rng, index, baseline):
    folder = tempfile.mkdtemp(prefix="troupe_chaos_%d_" % index)
    run_id = "chaos%d-%d" % (os.getpid(), index)
    launch = Launch(args, folder, run_id, restart=True)
    faults = []  # (generation, rank, seconds into the generation, newest checkpoint step)
    for generation in range(args.faults):
        deadline = time.monotonic() + args.timeout
        workers = {}
        while launch.running() and time.monotonic() < deadline:
            workers = run_processes(run_id, generation=generation)
            if len(workers) == args.workers:
                break
            time.sleep(0.02)
        if not launch.running() or len(workers) < args.workers:
            break
        started = time.monotonic()
        time.sleep(rng.uniform(args.min_delay, args.max_delay))
        if not launch.running():
            break
        step = newest_step(folder)
        live = run_processes(run_id, generation=generation)
        if not live:
            break
        pid = rng.choice(sorted(live))
        kind = args.fault if args.fault != "mixed" else rng.choice(["kill", "stop"])
        try:
            os.kill(pid, signal.SIGKILL if kind == "kill" else signal.SIGSTOP)
        except ProcessLookupError:
            break
        faults.append((generation, live[pid], time.monotonic() - started, step, kind))
    code = launch.wait(args.timeout)
    resumed = launch.resumed_steps()
    epoch, accuracy = last_epoch_row(folder)
    lost = []
    for step, path, error in checkpoints(folder):
        if error is not None:
            lost.append("%s does not load: %s" % (os.path.basename(path), error))
    for generation, rank, _, step, _ in faults:
        after = resumed.get(generation + 1)
        if after is None:
            continue  # the run ended before the next generation (the kill came too late)
        if after < step:
            lost.append("generation %d resumed at step %d, a checkpoint of step %d existed"
                        % (generation + 1, after, step))
    completed = code == 0 and epoch == args.epochs
    # A hung worker must have been named by a timeout (heartbeat or stall watch) each time.
    timeouts = sum(1 for line in launch.lines
                   if ("not even a heartbeat" in line and "lost the link" in line)
                   or ("(peer_timeout)" in line and "failed handling" in line))
    stops = sum(1 for f in faults if f[4] == "stop")
    if timeouts < stops:
        lost.append("%d hung worker(s), but %d timeout error(s) naming one" % (stops, timeouts))
    result = {
        "stops": stops, "timeouts": timeouts,
        "run": index, "faults": faults, "code": code, "completed": completed,
        "restarts": max(resumed) if resumed else 0, "accuracy": accuracy, "lost": lost,
        "within": accuracy is not None and abs(accuracy - baseline) <= args.tolerance,
        "folder": folder, "output": launch.lines,
    }
    if not args.keep and completed and not lost:
        shutil.rmtree(folder, ignore_errors=True)
    return result


# ---- faults beyond kill and stop (issue 10): each is one short launch, checked for a clean end ----

def _tcp_ports(pid):
    """The TCP ports process pid listens on (from /proc/PID/net/tcp and its socket inodes)."""
    inodes = set()
    try:
        for fd in os.listdir("/proc/%d/fd" % pid):
            try:
                link = os.readlink("/proc/%d/fd/%s" % (pid, fd))
            except OSError:
                continue
            if link.startswith("socket:["):
                inodes.add(link[8:-1])
        with open("/proc/%d/net/tcp" % pid) as f:
            rows = f.read().splitlines()[1:]
    except OSError:
        return []
    ports = []
    for row in rows:
        cells = row.split()
        if cells[3] == "0A" and cells[9] in inodes:  # LISTEN
            ip_hex, port_hex = cells[1].split(":")
            ip = ".".join(str(int(ip_hex[i:i + 2], 16)) for i in (6, 4, 2, 0))
            ports.append((ip, int(port_hex, 16)))
    return ports


def _wait_for_workers(launch, run_id, count, timeout, role="worker"):
    deadline = time.monotonic() + timeout
    while launch.running() and time.monotonic() < deadline:
        found = run_processes(run_id, role=role, generation=0)
        if len(found) >= count:
            return found
        time.sleep(0.02)
    return {}


def _outcome(args, launch, folder, code, expect_error=None):
    """(completed or clear error, data lost) of a finished launch."""
    epoch, _ = last_epoch_row(folder) if os.path.isdir(folder) else (0, None)
    lost = ["%s does not load: %s" % (os.path.basename(p), e)
            for _, p, e in checkpoints(folder) if e is not None]
    if code == 0 and epoch == args.scenario_epochs:
        end = "completed"
    elif code != 0 and expect_error and any(expect_error in l for l in launch.lines):
        end = "clear error"
    else:
        end = "NO (exit %d, epoch %d)" % (code, epoch)
    return end, lost


def scenario_planted(args, index):
    """Another user's folder and a directory where a socket would go, made before the run."""
    run_id = "chaos%d-planted%d" % (os.getpid(), index)
    planted = "/tmp/troupe-" + run_id
    os.makedirs(planted + "/node0.sock", exist_ok=True)
    os.chmod(planted, 0o777)
    folder = tempfile.mkdtemp(prefix="troupe_chaos_planted_")
    launch = Launch(args, folder, run_id, restart=False, epochs=args.scenario_epochs)
    code = launch.wait(args.timeout)
    end, lost = _outcome(args, launch, folder, code)
    if not os.path.isdir(planted + "/node0.sock"):
        lost.append("the planted directory was removed")
    shutil.rmtree(planted, ignore_errors=True)
    return {"launch": launch, "folder": folder, "end": end, "lost": lost, "detect": None}


def scenario_collide(args, index):
    """Two runs with one run id and one secret, the second started a second after the first."""
    run_id = "chaos%d-collide%d" % (os.getpid(), index)
    secret = tempfile.NamedTemporaryFile("w", prefix="troupe_chaos_secret_", delete=False)
    secret.write("one secret for both runs\n")
    secret.close()
    folders = [tempfile.mkdtemp(prefix="troupe_chaos_collide_") for _ in range(2)]
    first = Launch(args, folders[0], run_id, restart=False, secret_file=secret.name,
                   epochs=args.scenario_epochs)
    time.sleep(1.0)
    second = Launch(args, folders[1], run_id, restart=False, secret_file=secret.name,
                    epochs=args.scenario_epochs)
    codes = [first.wait(args.timeout), second.wait(args.timeout)]
    os.unlink(secret.name)
    ends, lost = [], []
    for launch, folder, code in zip((first, second), folders, codes):
        end, l = _outcome(args, launch, folder, code, expect_error="incarnation")
        ends.append(end)
        lost += l
    end = ends[0] if ends[0] == ends[1] else " / ".join(ends)
    first.lines += ["[chaos] --- the second run ---"] + second.lines
    return {"launch": first, "folder": folders[0], "end": end, "lost": lost, "detect": None}


def scenario_fds(args, index):
    """Worker 0 limited to 256 descriptors while 300 strangers connect to its port."""
    run_id = "chaos%d-fds%d" % (os.getpid(), index)
    folder = tempfile.mkdtemp(prefix="troupe_chaos_fds_")
    launch = Launch(args, folder, run_id, restart=False, epochs=args.scenario_epochs)
    workers = _wait_for_workers(launch, run_id, args.workers, args.timeout)
    strangers = []
    target = next((pid for pid, rank in workers.items() if rank == 0), None)
    if target:
        subprocess.run(["prlimit", "--pid", str(target), "--nofile=256:256"], check=False)
        deadline = time.monotonic() + 10
        ports = []
        while not ports and time.monotonic() < deadline:
            ports = [p for p in _tcp_ports(target) if not p[0].startswith("0.")]
            time.sleep(0.05)
        for ip, port in ports[:1]:
            if not launch.running():
                break
            for _ in range(300):
                s = socket.socket()
                s.setblocking(False)
                s.connect_ex((ip, port))
                strangers.append(s)
    during = launch.running()
    code = launch.wait(args.timeout)
    for s in strangers:
        s.close()
    end, lost = _outcome(args, launch, folder, code)
    if len(strangers) < 300 or not during:
        lost.append("the strangers did not all connect during the run: take more --scenario-epochs")
    lines = len(launch.lines)
    if lines > 2000:
        lost.append("%d output lines: the log was flooded" % lines)
    return {"launch": launch, "folder": folder, "end": end, "lost": lost, "detect": None,
            "note": "%d strangers, %d output lines" % (len(strangers), lines)}


def scenario_stalled_output(args, index):
    """Nobody reads the launcher's output for --stall-seconds while a worker is killed."""
    run_id = "chaos%d-stalled%d" % (os.getpid(), index)
    folder = tempfile.mkdtemp(prefix="troupe_chaos_stalled_")
    # A line per step from every worker: far more than the 64 KiB a pipe holds.
    launch = Launch(args, folder, run_id, restart=True, read_output=False,
                    epochs=args.scenario_epochs, log_every=1)
    workers = _wait_for_workers(launch, run_id, args.workers, args.timeout)
    time.sleep(0.5)
    killed = False
    if workers:
        try:
            os.kill(max(workers), signal.SIGKILL)
            killed = True
        except ProcessLookupError:
            pass
    time.sleep(args.stall_seconds)
    code = launch.wait(args.timeout)
    end, lost = _outcome(args, launch, folder, code)
    left = run_processes(run_id)
    if left:
        lost.append("processes left: %s" % sorted(left))
    if not killed:
        lost.append("the run ended before a worker could be killed: take more --scenario-epochs")
    return {"launch": launch, "folder": folder, "end": end, "lost": lost, "detect": None,
            "note": "%d lines relayed; %s" % (
                len(launch.lines),
                next((l for l in launch.lines if "lines dropped" in l), "none dropped"))}


def scenario_stop_server(args, index):
    """dist_sync with a parameter server that gets SIGSTOP: the run restarts and completes."""
    run_id = "chaos%d-server%d" % (os.getpid(), index)
    folder = tempfile.mkdtemp(prefix="troupe_chaos_server_")
    launch = Launch(args, folder, run_id, restart=True, servers=1, schedule="dist_sync",
                    epochs=args.scenario_epochs)
    servers = _wait_for_workers(launch, run_id, 1, args.timeout, role="server")
    _wait_for_workers(launch, run_id, args.workers, args.timeout)
    time.sleep(1.0)
    stopped = time.monotonic()
    if servers:
        os.kill(next(iter(servers)), signal.SIGSTOP)
    detect = None
    while launch.running() and time.monotonic() - stopped < args.timeout:
        if any("server 0" in l and ("culprit" in l or "hung or gone" in l) for l in launch.lines):
            detect = time.monotonic() - stopped
            break
        time.sleep(0.05)
    code = launch.wait(args.timeout)
    end, lost = _outcome(args, launch, folder, code)
    if detect is None:
        lost.append("no error named server 0")
    return {"launch": launch, "folder": folder, "end": end, "lost": lost, "detect": detect}


def scenario_stopped_launcher(args, index):
    """The launcher itself gets SIGSTOP for --stall-seconds (past the peer timeout) while its
    workers log every step: they must not block on their output, nor be taken for hung."""
    run_id = "chaos%d-stoplaunch%d" % (os.getpid(), index)
    folder = tempfile.mkdtemp(prefix="troupe_chaos_stoplaunch_")
    launch = Launch(args, folder, run_id, restart=False, epochs=args.scenario_epochs, log_every=1)
    workers = _wait_for_workers(launch, run_id, args.workers, args.timeout)
    time.sleep(0.5)
    stopped = bool(workers) and launch.running()
    if stopped:
        launch.process.send_signal(signal.SIGSTOP)
        time.sleep(args.stall_seconds)
        launch.process.send_signal(signal.SIGCONT)
    code = launch.wait(args.timeout)
    end, lost = _outcome(args, launch, folder, code)
    if not stopped:
        lost.append("the run ended before the launcher could be stopped")
    if any("hung or gone" in l for l in launch.lines):
        lost.append("a worker was taken for hung")
    return {"launch": launch, "folder": folder, "end": end, "lost": lost, "detect": None,
            "note": "launcher stopped %.0f s; %s" % (
                args.stall_seconds, next((l for l in launch.lines if "lines dropped" in l),
                                         "no line dropped"))}


def scenario_hyperparameter_mismatch(args, index):
    """Two ranks started by hand, the second with another learning rate: both must stop at
    rendezvous naming the key and both values, before a step trains."""
    run_id = "chaos%d-mismatch%d" % (os.getpid(), index)
    folder = tempfile.mkdtemp(prefix="troupe_chaos_mismatch_")
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    common = [args.troupe, "train", "--model", args.model, "--train_data", args.data + "/train",
              "--db_type", "lmdb", "--schedule", "bsp-allreduce", "--num_shards", "2",
              "--run_id", run_id, "--rendezvous", "tcp://127.0.0.1:%d" % port,
              "--num_epochs", str(args.scenario_epochs), "--epoch_size", str(args.epoch_size),
              "--threads", "1", "--log_every", "0"]
    began = time.monotonic()
    ranks = [subprocess.Popen(common + ["--shard_id", str(r), "--base_learning_rate",
                                        str(args.learning_rate * (10 if r else 1))],
                              cwd=folder, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True) for r in (0, 1)]
    outputs = [p.communicate(timeout=args.timeout)[0] for p in ranks]
    detect = time.monotonic() - began
    lines = ["[rank %d] %s" % (r, l) for r, out in enumerate(outputs) for l in out.splitlines()]
    named = any("base_learning_rate: rank 0 has" in l for l in lines)
    codes = [p.returncode for p in ranks]

    class Finished:
        pass
    launch = Finished()
    launch.lines = lines
    lost = []
    epoch, _ = last_epoch_row(folder)
    if epoch > 0:
        lost.append("%d epoch(s) trained with the ranks disagreeing" % epoch)
    end = "clear error" if named and all(c != 0 for c in codes) else "NO (exits %s)" % codes
    return {"launch": launch, "folder": folder, "end": end, "lost": lost, "detect": detect}


def scenario_refusal_flood(args, index):
    """Garbage connections to the run's rendezvous store for --stall-seconds: the run completes
    and the refusals are counted, logged at a bounded rate."""
    run_id = "chaos%d-flood%d" % (os.getpid(), index)
    folder = tempfile.mkdtemp(prefix="troupe_chaos_flood_")
    launch = Launch(args, folder, run_id, restart=False, epochs=args.scenario_epochs)
    _wait_for_workers(launch, run_id, args.workers, args.timeout)
    ports = [p for p in _tcp_ports(launch.process.pid) if not p[0].startswith("0.")]
    sent = 0
    if ports:
        ip, port = ports[0]
        until = time.monotonic() + args.stall_seconds
        while launch.running() and time.monotonic() < until:
            try:
                with socket.create_connection((ip, port), timeout=1) as s:
                    s.sendall(b"GET / HTTP/1.0\r\n\r\n")
                sent += 1
            except OSError:
                pass
    code = launch.wait(args.timeout)
    end, lost = _outcome(args, launch, folder, code)
    refusals = [l for l in launch.lines if "refused" in l or "closing the connection" in l]
    bound = 10 + args.stall_seconds / 5 + 2
    if len(refusals) > bound:
        lost.append("%d refusal lines for %d connections: the log was flooded" % (len(refusals),
                                                                                   sent))
    if sent == 0:
        lost.append("no connection reached the store (no port found)")
    return {"launch": launch, "folder": folder, "end": end, "lost": lost, "detect": None,
            "note": "%d garbage connections, %d refusal lines" % (sent, len(refusals))}


# ---- elastic runs (issue 33): a running generation never waits on a newcomer ----

def _elastic_command(args, run_id, epochs, rendezvous=None, secret=None, log_every=10):
    """A worker's `troupe train` flags of an elastic 2:3 run (a joiner adds --rendezvous)."""
    command = ["train", "--model", args.model, "--train_data", args.data + "/train",
               "--test_data", args.data + "/test", "--db_type", "lmdb",
               "--schedule", "bsp-allreduce", "--num_epochs", str(epochs),
               "--epoch_size", str(args.epoch_size), "--batch_size", str(args.batch_size),
               "--base_learning_rate", str(args.learning_rate), "--threads", "1",
               "--log_every", str(log_every), "--checkpoint_every", "1",
               "--peer_timeout", str(args.peer_timeout), "--rendezvous_timeout", "10"]
    if rendezvous:
        command += ["--num_workers", "2:3", "--rendezvous", rendezvous, "--run_id", run_id]
        if secret:
            command += ["--secret_file", secret]
    return command


class ElasticLaunch(Launch):
    """`troupe launch -n 2 --elastic 2:3` of an MLP run, its output collected."""

    def __init__(self, args, folder, run_id, epochs, rendezvous=None, secret=None, workers=2):
        command = [args.troupe, "launch", "-n", str(workers), "--elastic", "2:3", "--run_id", run_id]
        if rendezvous:
            command += ["--rendezvous", rendezvous]
        if secret:
            command += ["--secret-file", secret]
        command += ["--", "troupe"] + _elastic_command(args, run_id, epochs)
        self.lines = []
        self.started = time.monotonic()
        self.process = subprocess.Popen(command, cwd=folder, stdout=subprocess.PIPE,
                                        stderr=subprocess.STDOUT, text=True)
        self.reading = threading.Event()
        self.reading.set()
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def wait_line(self, text, timeout):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and self.running():
            if any(text in l for l in self.lines):
                return True
            time.sleep(0.02)
        return any(text in l for l in self.lines)

    def store(self):
        for line in self.lines:
            m = re.search(r"rendezvous (tcp://[0-9.:]+)", line)
            if m:
                return m.group(1)
        return None


def _elastic_outcome(args, launch, folder, code, epochs):
    epoch, _ = last_epoch_row(folder) if os.path.isdir(folder) else (0, None)
    lost = ["%s does not load: %s" % (os.path.basename(p), e)
            for _, p, e in checkpoints(folder) if e is not None]
    if any("did not close it" in l or "refused this run" in l for l in launch.lines):
        lost.append("the running workers waited on a newcomer")
    end = "completed" if code == 0 and epoch == epochs else "NO (exit %d, epoch %d)" % (code, epoch)
    return end, lost


def _secret(folder):
    path = os.path.join(folder, "secret")
    with open(path, "w") as f:
        f.write("chaos-elastic-secret-0123456789\n")
    return path


def _scenario_joiner_killed(args, index, point):
    """A joiner killed when it starts, while the run pauses for it, or once it was admitted."""
    run_id = "chaos%d-joiner-%s%d" % (os.getpid(), point, index)
    folder = tempfile.mkdtemp(prefix="troupe_chaos_joiner_")
    secret = _secret(folder)
    epochs = args.scenario_epochs  # long enough for a joiner to be admitted mid-run
    launch = ElasticLaunch(args, folder, run_id, epochs, secret=secret)
    killed, detect = None, None
    if launch.wait_line("generation 0", args.timeout) and launch.wait_line(" step ", args.timeout):
        joiner = subprocess.Popen(
            [args.troupe] + _elastic_command(args, run_id, epochs, launch.store(), secret),
            cwd=folder, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
        marker = {"starting": None, "waiting": "a worker waits to join",
                  "admitted": "of 3 ("}[point]
        if marker is None or launch.wait_line(marker, 60):
            joiner.kill()
            killed = time.monotonic()
        joiner.wait()
    code = launch.wait(args.timeout)
    end, lost = _elastic_outcome(args, launch, folder, code, epochs)
    if killed is None:
        lost.append("the joiner never reached the point to kill it at")
    elif point != "starting":
        # The run goes on without it: the next generation of 2 (or the end of the run).
        for line in launch.lines[::-1]:
            if "of 2 (" in line or "all 2 process(es) exited 0" in line:
                detect = time.monotonic() - killed
                break
    return {"launch": launch, "folder": folder, "end": end, "lost": lost, "detect": detect,
            "note": "joiner killed %s" % point}


def scenario_joiner_starting(args, index):
    return _scenario_joiner_killed(args, index, "starting")


def scenario_joiner_waiting(args, index):
    return _scenario_joiner_killed(args, index, "waiting")


def scenario_joiner_admitted(args, index):
    return _scenario_joiner_killed(args, index, "admitted")


def scenario_elastic_liar(args, index):
    """A client with write access to the run's store (here a shared-folder store) writes the next
    round's count and its member 0, as a joiner would, and never acts: nobody may wait on it."""
    run_id = "chaos%d-liar%d" % (os.getpid(), index)
    folder = tempfile.mkdtemp(prefix="troupe_chaos_liar_")
    store = os.path.join(folder, "store")
    epochs = args.scenario_epochs  # long enough for a joiner to be admitted mid-run
    launch = ElasticLaunch(args, folder, run_id, epochs, rendezvous="file://" + store)
    wrote = False
    if launch.wait_line("generation 0", args.timeout) and launch.wait_line(" step ", args.timeout):
        def key_file(key):  # the FileStore's encoding of a key of the run's prefix store
            key = "%s/%s" % (run_id, key)  # generation 0 of the launch: the run id itself
            return os.path.join(store, "".join(
                c if c.isalnum() or c in "_-" else "%%%02X" % ord(c) for c in key))
        for key, value in (("elastic/1/count", "1"), ("elastic/1/member/0", "-1 -1 0 0 0 liar:1")):
            with open(key_file(key), "w") as f:
                f.write(value)
        wrote = True
    code = launch.wait(args.timeout)
    end, lost = _elastic_outcome(args, launch, folder, code, epochs)
    if not wrote:
        lost.append("the run ended before the liar wrote")
    if any("a worker waits to join" in l for l in launch.lines):
        lost.append("the run paused for the liar")
    return {"launch": launch, "folder": folder, "end": end, "lost": lost, "detect": None,
            "note": "forged round 1 count and member 0"}


def scenario_elastic_stopped_member(args, index):
    """SIGSTOP one of three workers of an elastic run: the others re-form and finish, and the
    launcher ends the stopped one instead of waiting on it for ever."""
    run_id = "chaos%d-elasticstop%d" % (os.getpid(), index)
    folder = tempfile.mkdtemp(prefix="troupe_chaos_elasticstop_")
    epochs = args.scenario_epochs  # long enough for a joiner to be admitted mid-run
    launch = ElasticLaunch(args, folder, run_id, epochs, workers=3)
    stopped, detect = None, None
    workers = _wait_for_workers(launch, run_id, 3, args.timeout)
    if workers and launch.wait_line(" step ", args.timeout):
        pid = next(p for p, r in workers.items() if r == 1)
        os.kill(pid, signal.SIGSTOP)
        stopped = time.monotonic()
        if launch.wait_line("of 2 (", args.timeout):
            detect = time.monotonic() - stopped
    code = launch.wait(args.timeout)
    end, lost = _elastic_outcome(args, launch, folder, code, epochs)
    if stopped is None:
        lost.append("no worker could be stopped")
    left = run_processes(run_id)
    if left:
        lost.append("processes left: %s" % sorted(left))
    return {"launch": launch, "folder": folder, "end": end, "lost": lost, "detect": detect,
            "note": next((l for l in launch.lines if "was stopped (SIGSTOP)" in l),
                         "no stopped worker named")}


SCENARIOS = {
    "planted-folder": scenario_planted,
    "colliding-run": scenario_collide,
    "descriptor-exhaustion": scenario_fds,
    "stalled-launcher-output": scenario_stalled_output,
    "stopped-server": scenario_stop_server,
    "stopped-launcher": scenario_stopped_launcher,
    "hyperparameter-mismatch": scenario_hyperparameter_mismatch,
    "refusal-flood": scenario_refusal_flood,
    "elastic-joiner-killed-starting": scenario_joiner_starting,
    "elastic-joiner-killed-waiting": scenario_joiner_waiting,
    "elastic-joiner-killed-admitted": scenario_joiner_admitted,
    "elastic-liar": scenario_elastic_liar,
    "elastic-stopped-member": scenario_elastic_stopped_member,
}


def run_scenarios(args):
    rows, ok = [], True
    for name in args.scenarios.split(","):
        if name not in SCENARIOS:
            sys.exit("chaos: unknown scenario '%s' (known: %s)" % (name, ", ".join(SCENARIOS)))
        for index in range(1, args.runs + 1):
            began = time.monotonic()
            r = SCENARIOS[name](args, index)
            r["seconds"] = time.monotonic() - began
            print("chaos: %s run %d: %s in %.0f s%s" % (
                name, index, r["end"], r["seconds"],
                "; " + r["note"] if r.get("note") else ""), flush=True)
            good = r["end"] in ("completed", "clear error") and not r["lost"]
            if not good:
                ok = False
                print("\n".join(r["launch"].lines[-25:]))
            elif not args.keep:
                shutil.rmtree(r["folder"], ignore_errors=True)
            rows.append((name, r))
    print()
    print("| fault | run | completed or clear error | time to detect | data lost | seconds |")
    print("|---|---|---|---|---|---|")
    for index, (name, r) in enumerate(rows):
        print("| %s | %d | %s | %s | %s | %.0f |" % (
            name, 1 + index % args.runs, r["end"],
            "-" if r["detect"] is None else "%.1f s" % r["detect"],
            "; ".join(r["lost"]) if r["lost"] else "none", r["seconds"]))
    return 0 if ok else 1


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--troupe", default=os.path.join(ROOT, "build/bin/troupe"))
    parser.add_argument("--data", default=os.path.join(ROOT, "build/testdata/lmdb"),
                        help="folder with train/ and test/ LMDB databases")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--faults", type=int, default=3, help="faults per run")
    parser.add_argument("--fault", choices=["kill", "stop", "mixed"], default="kill",
                        help="SIGKILL a worker, SIGSTOP it (a hang), or either at random")
    parser.add_argument("--peer-timeout", type=float, default=5,
                        help="troupe's --peer_timeout, seconds (a hung worker is found in this)")
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--servers", type=int, default=0)
    parser.add_argument("--schedule", default="bsp-allreduce")
    parser.add_argument("--model", default="mlp")
    parser.add_argument("--epochs", type=int, default=40)
    parser.add_argument("--epoch-size", type=int, default=3200)
    parser.add_argument("--batch-size", type=int, default=32, help="per worker")
    parser.add_argument("--learning-rate", type=float, default=0.05)
    parser.add_argument("--min-delay", type=float, default=0.3)
    parser.add_argument("--max-delay", type=float, default=1.5)
    parser.add_argument("--tolerance", type=float, default=0.005, help="test accuracy, absolute")
    parser.add_argument("--timeout", type=float, default=600, help="seconds per launch")
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--keep", action="store_true", help="keep every run's folder")
    parser.add_argument("--scenarios", default=None,
                        help="instead of kill/stop runs, run these faults (comma-separated, "
                             "or 'all'): " + ", ".join(SCENARIOS))
    parser.add_argument("--scenario-epochs", type=int, default=30,
                        help="epochs of each scenario's run")
    parser.add_argument("--stall-seconds", type=float, default=20,
                        help="stalled-launcher-output: seconds nobody reads the launcher")
    args = parser.parse_args()
    if args.scenarios == "all":
        args.scenarios = ",".join(SCENARIOS)
    for path, what in ((args.troupe, "troupe binary"), (args.data + "/train", "training data")):
        if not os.path.exists(path):
            sys.exit("chaos: no %s at %s (build first: bash scripts/build.sh; "
                     "cd build && ctest -R setup_fashion_mnist)" % (what, path))
    if args.scenarios:
        return run_scenarios(args)
    seed = args.seed if args.seed is not None else random.randrange(1 << 30)
    rng = random.Random(seed)
    print("chaos: seed %d, %d worker(s), %d server(s), %s, %s, %d epochs of %d"
          % (seed, args.workers, args.servers, args.schedule, args.model, args.epochs,
             args.epoch_size), flush=True)

    folder = tempfile.mkdtemp(prefix="troupe_chaos_baseline_")
    base = Launch(args, folder, "chaos%d-base" % os.getpid(), restart=False)
    code = base.wait(args.timeout)
    epoch, baseline = last_epoch_row(folder)
    if code != 0 or epoch != args.epochs:
        print("\n".join(base.lines[-30:]))
        sys.exit("chaos: the uninterrupted baseline failed (exit %d, %d epochs); kept %s"
                 % (code, epoch, folder))
    shutil.rmtree(folder, ignore_errors=True)
    print("chaos: baseline test accuracy %.4f" % baseline, flush=True)

    results = []
    for index in range(1, args.runs + 1):
        r = chaos_run(args, rng, index, baseline)
        results.append(r)
        kills = ", ".join("%s w%d@%.1fs(ckpt %d)" % (kind, rank, t, step)
                          for _, rank, t, step, kind in r["faults"])
        print("chaos: run %d: exit %d, %d restart(s), kills: %s" % (index, r["code"],
                                                                   r["restarts"], kills or "none"),
              flush=True)

    print()
    print("| run | faults injected (kill/stop) | timeout errors | restarts | completed | "
          "test accuracy | vs baseline | data lost |")
    print("|---|---|---|---|---|---|---|---|")
    for r in results:
        accuracy = "-" if r["accuracy"] is None else "%.4f" % r["accuracy"]
        delta = "-" if r["accuracy"] is None else "%+.4f" % (r["accuracy"] - baseline)
        print("| %d | %d (%d/%d) | %d | %d | %s | %s | %s | %s |" % (
            r["run"], len(r["faults"]), len(r["faults"]) - r["stops"], r["stops"], r["timeouts"],
            r["restarts"], "yes" if r["completed"] else "NO",
            accuracy, delta, "; ".join(r["lost"]) if r["lost"] else "no"))
    faults = sum(len(r["faults"]) for r in results)
    completed = sum(r["completed"] for r in results)
    lost = sum(bool(r["lost"]) for r in results)
    within = sum(r["within"] for r in results)
    print()
    print("faults injected %d (of %d planned: a run that ends first takes fewer), runs %d, runs "
          "completed %d, data lost %d, accuracy within %.3f of the baseline (%.4f) %d/%d"
          % (faults, args.faults * len(results), len(results), completed, lost, args.tolerance,
             baseline, within, len(results)))
    ok = completed == len(results) and lost == 0 and within == len(results)
    for r in results:
        if not (r["completed"] and not r["lost"] and r["within"]):
            print("\nrun %d (folder %s), last lines:\n%s" % (r["run"], r["folder"],
                                                            "\n".join(r["output"][-25:])))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
