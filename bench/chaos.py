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
Python 3 standard library only. Example (from the repository root, after scripts/build.sh and the
test data, `ctest -R setup_fashion_mnist`):

  python3 bench/chaos.py --runs 3 --faults 3
"""

import argparse
import os
import random
import re
import shutil
import signal
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
    """The meta of a troupe checkpoint (actors/checkpoint.cc), after checking it whole; raises
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

    def __init__(self, args, folder, run_id, restart):
        command = [args.troupe, "launch", "-n", str(args.workers), "--launcher", "local",
                   "--run_id", run_id]
        if args.servers:
            command += ["-s", str(args.servers)]
        if restart:
            command += ["--on-failure", "restart", "--max-restarts", str(args.faults + 2)]
        data = args.data
        command += ["--", "troupe", "train", "--model", args.model,
                    "--train_data", data + "/train", "--test_data", data + "/test",
                    "--db_type", "lmdb", "--schedule", args.schedule,
                    "--num_epochs", str(args.epochs), "--epoch_size", str(args.epoch_size),
                    "--batch_size", str(args.batch_size),
                    "--base_learning_rate", str(args.learning_rate),
                    "--checkpoint_every", "1", "--log_every", "0", "--threads", "1",
                    "--peer_timeout", str(args.peer_timeout),
                    "--stall_warning", str(max(0.5, args.peer_timeout / 2))]
        self.lines = []
        self.process = subprocess.Popen(command, cwd=folder, stdout=subprocess.PIPE,
                                        stderr=subprocess.STDOUT, text=True)
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self):
        for line in self.process.stdout:
            self.lines.append(line.rstrip("\n"))

    def running(self):
        return self.process.poll() is None

    def wait(self, timeout):
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
    args = parser.parse_args()
    for path, what in ((args.troupe, "troupe binary"), (args.data + "/train", "training data")):
        if not os.path.exists(path):
            sys.exit("chaos: no %s at %s (build first: bash scripts/build.sh; "
                     "cd build && ctest -R setup_fashion_mnist)" % (what, path))
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
