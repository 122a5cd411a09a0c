#!/usr/bin/env python3
"""Scaling model of troupe: measure the network path and a training step on 2-8 hosts made on
this machine, fit an alpha-beta model, check it against those runs, then predict the efficiency
(compute time / step time) of data-parallel training far past this machine.

    flock /tmp/troupe-build.lock ninja -C build -j2 troupe_cli     # build/bin/troupe
    sudo python3 bench/scaling.py [--hosts 2,4,8] [--models lenet,mlp] [--rounds 4] [--extra]
        [--steps lenet=200,mlp=1500] [--epochs 4] [--prefix sc] [--subnet 10.81.0]
    python3 bench/scaling.py --from bench/scaling_results.md   # refit and predict, no measuring

Writes bench/scaling_results.md (the raw measurements, also as a JSON block that --from reads
back, the fitted model, the validation and the prediction tables) and docs/scaling.svg. It waits
(up to --wait-minutes) while another benchmark's hosts (namespaces bh-*, bt-*) exist.

Measurements (as root; hosts from tests/hosts/hosts.sh: network namespaces on a bridge, each with
its own /tmp, /dev/shm and sshd, processes of different hosts meet only over TCP on eth0; prefix
--prefix, torn down at the end, also on an error or a signal; the host plumbing, the process
start and the waiting are bench/allreduce_hosts.py's, imported from it):
  link     `troupe bench allreduce -n N --worker --interface eth0` started by hand, one rank per
           host (TROUPE_RANK, TROUPE_NUM_WORKERS, a file:// store in hosts.sh's shared folder), as
           bench/allreduce_hosts.py does. N = 2: sizes 0.001 MB (alpha), the models' gradient
           sizes, 25 and 100 MB (beta). N = 4 and 8: the same small sizes and 25 MB: how much
           N ranks on this machine's cores slow the allreduce (A8, A8').
  shm      `troupe bench allreduce -n 2` (its own local launcher) inside host 0: two processes of
           one host, chunks through the transport's shared-memory arena: alpha_s, beta_s.
  compute  `troupe train configs/lenet.toml --schedule local --threads 1` (and `--model mlp`),
           per-process batch 64, Fashion-MNIST LMDB at build/testdata/lmdb, no test pass:
           k = 1 (one process alone: the compute time c of a step) and k = 2, 4, 8 copies at once,
           one per host (the CPU share: c_k, the step of one process while k-1 others train;
           copy 0 runs with --trace: the spread of its step times, A10).
  step     `troupe launch --launcher ssh -H HOSTFILE -n N --interface eth0` on host 0 (the
           command line of tests/hosts_train_test.cc), each worker running the same `troupe train`
           with `--schedule bsp-allreduce` on its own host, N = 2, 4, 8: measured step time =
           64 N / (inputs/s of the chief's CSV log).
  trace    `--trace` of one single-process run (forward and backward time) and of one 2-host run
           (when in backward each gradient bucket reaches the reducer): the overlap inputs.
  --extra  2 hosts x 2 workers with `--allreduce hierarchical`, and 2 hosts with `-n 2 -s 2
           --schedule dist_sync` (one server per host): checks of the other two schemes.
Step times: inputs of epochs 2..E over their time (epoch 1 is the warm-up, in which oneDNN builds
its kernels; for the k concurrent local runs, epochs 2..E-1, when all k surely run); each figure is
the median over --rounds rounds that take every configuration in turn. 1 MB = 1e6 bytes; 1 MiB =
2^20 bytes (troupe's bucket sizes are MiB).

Model (every assumption is listed here; the script's functions follow it one to one):
 A1. Allreduce of S bytes by a ring of N ranks: T = 2(N-1) alpha + 2(N-1)/N * S / beta. alpha is
     a ring step's latency (troupe's actors, framing, TCP), fitted as T(0.001 MB)/2 at N = 2; beta
     is the bytes per second one rank sends, fitted as S / (T(S) - 2 alpha) at N = 2, averaged
     over 25 and 100 MB. The same for shared memory (alpha_s, beta_s) between processes of a host.
 A1' (final model, this machine). A bucket of at most one ring segment (4 MiB) is not pipelined:
     its ring steps run one after another, each a send then a sum, so it moves at beta_1 < beta,
     fitted like beta from the models' gradient sizes (0.94 and 1.72 MB) at N = 2. Every bucket
     of LeNet and the MLP is one segment; ResNet-50's 25 MiB buckets are not.
 A2. Hierarchical (L processes per host, H hosts, --allreduce hierarchical): reduce-scatter in
     the host over shared memory, (L-1) alpha_s + (L-1)/L S/beta_s; then the L processes of a
     host each run a ring of H over their S/L slice; the L rings share the host's link, so each
     gets beta/L: T = 2(H-1) alpha + 2(H-1)/H (S/L) / (beta/L); then all-gather in the host (as
     the reduce-scatter). The three stages add up (no pipelining across stages).
 A3. Flat ring over P = L H processes (--allreduce ring): one ring, ordered host by host, so each
     host's link carries one ring hop; every ring step waits for the slowest hop: T = 2(P-1)
     alpha + 2(P-1)/P S / min(beta, beta_s) (beta_s only where L > 1).
 A4. Parameter servers (dist_sync), as many servers as hosts, one per host (troupe launch places
     server i on host i, round robin): the L replicas of a host are summed inside the host first
     (as MXNet's dist_sync does over a machine's GPUs: the in-host stages of A2), then each host
     pushes S and pulls S, of which the 1/H its own server holds stays in the host:
     T = 2 alpha + 2 (H-1)/H S / beta (~ 2S/beta + 2 alpha for large H; push and pull do not
     overlap for one bucket: the server answers a pull only once every worker pushed).
 A5. Buckets as the replica makes them (actors/roles/replica.cc): parameters of whole layers, last
     layer first, a bucket closes once it holds >= 1 MiB (the first) or >= 25 MiB (later ones);
     the rest is the last bucket, handed on when backward ends. LeNet: [ip2+ip1 1.62 MB, conv2+
     conv1 0.10 MB]; the MLP's 0.94 MB is one bucket, so none of its communication overlaps.
 A6. Overlap: a bucket's allreduce starts when backward hands it on (its ready time, from the
     2-host trace, as a fraction of backward; without a trace, in proportion to its bytes); one
     link carries them: a bucket finishes no earlier than ready + T(bucket) and no earlier than
     the previous bucket's finish + its own bandwidth part (buckets pipeline; only bandwidth
     queues). Step time = c + max(0, finish of the last bucket - end of backward): the part of
     the communication not hidden behind backward. The last bucket never overlaps.
 A7. c, the compute time of a step, is everything that is not communication (reading, forward,
     backward, update), measured as one process's step time alone (--schedule local); backward
     is the fraction of it that the single-process trace shows.
 A8. This machine has 2 CPU cores for all its hosts: N processes share them. The compute of the
     validation runs is c_N, measured (N processes training at once), not max(1, N/2) c. Plain
     model: the network here is not a wire but CPU work (copies through the veth pair, the ring's
     sums), so the link slows by the same measured share: alpha_N = alpha r, beta_N = beta / r
     with r = c_N / c_2 (the link was measured with 2 processes on the 2 cores).
 A8' (final model). The allreduce bench at N hosts x 1 rank shows that the CPU share of the
     compute does not say how much the link slows (latency slows far less than r; 25 MB more),
     so the final model measures it: g(N, S) = the bench's time at N / A1 (with A1') at N with
     the 2-host parameters, interpolated in log S between the sizes measured (which include the
     models' gradient sizes); every bucket's communication is A1/A2/A4 x g(P, S), P = the
     processes on the machine (servers included). For N hosts x 1 rank the communication is then
     the bench's own time at that size: what the steps check is the compute, the overlap (A6)
     and the CPU bound (A11), not the ring formula's growth in N, which this 2-core machine
     cannot show (the N = 2 bench checks its shape in S).
 A9. Predictions (other machines): no CPU sharing, each process has its own CPU or GPU; beta =
     the line rate (10, 25, 100 Gbit/s / 8), full duplex, troupe reaching it; alpha = as measured
     here (software latency per ring step dominates a data-centre wire's); in-host stages at the
     shared memory's alpha_s, beta_s measured here (--intra-gbps overrides beta_s: NVLink would
     be far faster). L = --per-host processes (GPUs) per host (8) for all three schemes.
     ResNet-50: 25.6 M parameters, fp32 gradients S = 102.4 MB, c = 85 ms (one H100 at ~3,000
     images/s, batch 256 per GPU), backward = 2/3 of c, gradients produced at an even byte rate
     over backward. LeNet-sized: 431,080 parameters, c and the bucket ready times as measured
     here for batch 64, one thread. No stragglers (A10) in the predictions.
 A10 (measured, reported, NOT used). A synchronous step waits for the slowest rank: m =
     E[max of N draws] / E[one draw] of one process's step time while N processes train at once
     (the percentiles of its step times, from its trace, drawn independently). Tried as a factor
     on c_N: it helped LeNet (m <= 1.15) but put the MLP at 8 hosts 40% over (m = 3.7: an
     oversubscribed MLP process loses whole scheduler slices, a heavy tail that coupled ranks,
     which free the CPU while they wait, do not see), so the final model leaves it out.
 A11 (final model, this machine). Work conservation: N processes cannot take less than their
     total CPU work over the machine's cores. Each process keeps a core busy while it sends
     (the 2-host bench is taken as CPU-bound, one core per rank), so a step takes at least
     c_N + P/cores x W, W = the bandwidth part of its buckets' communication at the 2-host
     rates (A1/A1'/A2/A4 with beta, beta_1, beta_s), P = processes on the machine (servers
     included). The final step time is max(critical path, this bound): the critical path is
     c_N + exposed communication (A6) slowed by g (A8'). A1', A8', A11 came after the plain
     model missed (LeNet -24..-31%, the MLP at 8 hosts +52%); they take no number from the step
     runs, but both data sets in bench/scaling_results.md were in view when they were chosen.
"""
import argparse
import csv
import datetime
import json
import math
import os
import platform
import re
import secrets
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from allreduce_hosts import (Hosts, ToolError, cpu_times, interrupt_on_termination,  # noqa: E402
                             tail, take_down, wait_all)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIG = os.path.join(ROOT, "configs/lenet.toml")
DATA = os.path.join(ROOT, "build/testdata/lmdb")
RESULTS = os.path.join(ROOT, "bench/scaling_results.md")
SVG = os.path.join(ROOT, "docs/scaling.svg")
BATCH = 64  # per process (configs/lenet.toml)
MIB = 1 << 20
FIRST_BUCKET, BUCKET = 1 * MIB, 25 * MIB  # troupe's defaults (first_bucket_mb, bucket_size_mb)
TINY_MB = 0.001
SEGMENT = 4 * MIB  # the ring's segment (ReducerConfig::segment_bytes): one segment, no pipelining
LINK_BIG_MB = (25.0, 100.0)

# Parameters per layer, in forward order (kernels/net.cc: buildLenet, buildMlp).
LAYERS = {
    "lenet": [("conv1", 20 * 25 + 20), ("conv2", 50 * 20 * 25 + 50), ("ip1", 800 * 500 + 500),
              ("ip2", 500 * 10 + 10)],
    "mlp": [("fc1", 784 * 256 + 256), ("fc2", 256 * 128 + 128), ("fc3", 128 * 10 + 10)],
}
RESNET50 = {"params": 25.6e6, "bytes": 102.4e6, "compute_s": 0.085, "backward_frac": 2 / 3}
SCHEMES = ("ring", "hierarchical", "ps")
SCHEME_NAME = {"ring": "flat ring", "hierarchical": "hierarchical", "ps": "param. servers"}


def grad_mb(model):
    return sum(n for _, n in LAYERS[model]) * 4 / 1e6


# =================================================================================================
# The model
# =================================================================================================

def buckets_of(piece_bytes):
    """A5: bucket sizes in bytes, in the order backward hands them on, from the parameter bytes
    of each layer in forward order; also each bucket's share of the bytes handed on before it
    closes (its ready time if gradients come at an even byte rate)."""
    out, cur, cap, done = [], 0, FIRST_BUCKET, 0
    total = sum(piece_bytes)
    for b in reversed(piece_bytes):
        cur += b
        done += b
        if cur >= cap:
            out.append((cur, done / total))
            cur, cap = 0, BUCKET
    if cur:
        out.append((cur, 1.0))
    return out


def t_ring(s, n, a, b):
    """A1."""
    return 0.0 if n < 2 else 2 * (n - 1) * a + 2 * (n - 1) / n * s / b


def t_ring_parts(s, n, a, b):
    return (0.0, 0.0) if n < 2 else (2 * (n - 1) * a, 2 * (n - 1) / n * s / b)


def comm_parts(scheme, s, L, H, link, shm, shared_nic=True):
    """(latency, bandwidth) seconds of one bucket of s bytes. link = (alpha, beta) between hosts,
    shm = (alpha_s, beta_s) inside one. shared_nic: the L rings of hierarchical reduction share
    one link of beta (A2); False on this machine, where the 'link' is CPU work per process and
    the CPU share is in link already (A8)."""
    a, b = link
    a_s, b_s = shm
    if scheme == "ring":  # A3
        p = L * H
        if p < 2:
            return 0.0, 0.0
        step_a = a if H > 1 else a_s
        step_b = (min(b, b_s) if L > 1 else b) if H > 1 else b_s
        return t_ring_parts(s, p, step_a, step_b)
    intra_lat = 2 * (L - 1) * a_s if L > 1 else 0.0
    intra_bw = 2 * (L - 1) / L * s / b_s if L > 1 else 0.0
    if scheme == "hierarchical":  # A2
        lat, bw = t_ring_parts(s / L, H, a, b / L if shared_nic else b)
        return intra_lat + lat, intra_bw + bw
    if scheme == "ps":  # A4
        if H < 2:
            return intra_lat, intra_bw
        return intra_lat + 2 * a, intra_bw + 2 * (H - 1) / H * s / b
    raise ValueError(scheme)


def exposed_comm(buckets, backward_s, parts_of):
    """A6: seconds of communication after backward ends. buckets: [(bytes, ready fraction of
    backward)], in order; parts_of(bytes) -> (latency, bandwidth) seconds."""
    finish = 0.0
    for size, frac in buckets:
        lat, bw = parts_of(size)
        ready = frac * backward_s
        finish = max(ready + lat + bw, finish + bw)
    return max(0.0, finish - backward_s)


def step_time(c, backward_frac, buckets, parts_of):
    exposed = exposed_comm(buckets, backward_frac * c, parts_of)
    return c + exposed, exposed


class Fit:
    """The fitted model parameters from the raw measurements (a dict, as in the JSON block):
    medians over rounds, or, with rnd, one round's own numbers (validation pairs each round's
    step runs with the same round's compute and link measurements)."""

    def __init__(self, raw, rnd=None):
        self.raw = raw
        link = raw["link"]
        shm = raw["shm"]
        compute = raw["compute"]
        # per model and n: percentiles of one process's step seconds (A10); medians: their mean
        self.jitter = {m: {int(k): [statistics.mean(x) for x in zip(*v)] for k, v in d.items()}
                       for m, d in raw.get("jitter", {}).items()}
        if rnd is not None:
            link = {n: {mb: v[rnd] for mb, v in d.items()} for n, d in raw["link_all"].items()}
            shm = {mb: v[rnd] for mb, v in raw["shm_all"].items()}
            compute = {m: {k: statistics.mean(v[rnd]) for k, v in d.items()}
                       for m, d in raw["compute_all"].items()}
            self.jitter = {m: {int(k): v[rnd] for k, v in d.items()}
                           for m, d in raw.get("jitter", {}).items()}
        self.link = {int(n): d for n, d in link.items()}
        link2 = self.link[2]
        self.alpha = link2[key(TINY_MB)] / 1e3 / 2  # ms -> s
        self.betas = {mb: mb * 1e6 / (link2[key(mb)] / 1e3 - 2 * self.alpha)
                      for mb in LINK_BIG_MB}
        self.beta = statistics.mean(self.betas.values())
        # A1': buckets of one segment: the gradient sizes measured at N = 2 (0.001 < S <= 4 MiB)
        small = [float(mb) for mb in link2 if TINY_MB < float(mb) <= SEGMENT / 1e6]
        self.betas1 = {mb: mb * 1e6 / (link2[key(mb)] / 1e3 - 2 * self.alpha) for mb in small}
        self.beta1 = statistics.mean(self.betas1.values()) if small else self.beta
        self.alpha_s = shm[key(TINY_MB)] / 1e3 / 2
        self.betas_s = {mb: mb * 1e6 / (shm[key(mb)] / 1e3 - 2 * self.alpha_s)
                        for mb in LINK_BIG_MB}
        self.beta_s = statistics.mean(self.betas_s.values())
        self.models = [m for m in LAYERS if m in compute]
        self.c = {m: {int(k): v for k, v in compute[m].items()} for m in self.models}
        self.traces = raw.get("trace", {})
        m = re.match(r"(\d+) CPUs", raw.get("machine", ""))
        self.cores = int(m.group(1)) if m else 2

    def share(self, model, k):
        """c_k / c_1: the measured CPU share (A8); interpolated in log k between measured k."""
        cs = self.c[model]
        if k in cs:
            return cs[k] / cs[1]
        ks = sorted(cs)
        lo = max(x for x in ks if x <= k) if any(x <= k for x in ks) else ks[0]
        hi = min(x for x in ks if x >= k) if any(x >= k for x in ks) else ks[-1]
        if lo == hi:
            return cs[lo] / cs[1] * (max(1, k / 2) / max(1, lo / 2))
        t = (math.log(k) - math.log(lo)) / (math.log(hi) - math.log(lo))
        return (cs[lo] + t * (cs[hi] - cs[lo])) / cs[1]

    def link_at(self, model, n):
        """A8, plain: (alpha, beta) and (alpha_s, beta_s) with n processes on this machine's
        cores, slowed by the compute's CPU share."""
        r = max(1.0, self.share(model, n) / self.share(model, 2))
        return (self.alpha * r, self.beta / r), (self.alpha_s * r, self.beta_s / r), r

    def t_model(self, n, size):
        """A1 with A1': the 2-host alpha, and beta_1 for a bucket of one segment, else beta."""
        return t_ring(size, n, self.alpha, self.beta1 if size <= SEGMENT else self.beta)

    def slowdown(self, p, size):
        """A8', final: how much slower the allreduce bench ran with p ranks on this machine's
        cores than A1/A1' with the 2-host parameters, at this size (interpolated in log size
        between the sizes measured, held at the ends); None where p ranks were not measured."""
        d = self.link.get(p)
        if p < 2 or not d:
            return None
        pts = sorted((float(mb) * 1e6, ms / 1e3 / self.t_model(p, float(mb) * 1e6))
                     for mb, ms in d.items())
        if size <= pts[0][0]:
            return pts[0][1]
        for (s0, g0), (s1, g1) in zip(pts, pts[1:]):
            if size <= s1:
                t = (math.log(size) - math.log(s0)) / (math.log(s1) - math.log(s0))
                return g0 + t * (g1 - g0)
        return pts[-1][1]

    def straggler(self, model, n):
        """A10: E[the slowest of n ranks' step] / E[a rank's step], from the distribution of one
        process's step times while n processes train at once (its trace's percentiles)."""
        q = self.jitter.get(model, {}).get(n)
        if not q or n < 2:
            return 1.0
        k = len(q) - 1
        mean = sum((q[i] + q[i + 1]) / 2 for i in range(k)) / k
        emax = sum((q[i] + q[i + 1]) / 2 * (((i + 1) / k) ** n - (i / k) ** n)
                   for i in range(k))
        return emax / mean

    def backward_frac(self, model):
        t = self.traces.get(model, {})
        return t.get("backward_frac", 2 / 3)

    def buckets(self, model):
        """A5 + A6: [(bytes, ready fraction)], ready fractions from the 2-host trace if any."""
        b = buckets_of([n * 4 for _, n in LAYERS[model]])
        ready = self.traces.get(model, {}).get("ready_frac")
        if ready and len(ready) == len(b):
            b = [(size, min(1.0, max(0.0, r))) for (size, _), r in zip(b, ready)]
        if b:
            b[-1] = (b[-1][0], 1.0)  # the last bucket goes when backward ends
        return b


def key(mb):
    return f"{mb:g}"


def resnet_buckets():
    pieces = [RESNET50["bytes"] / 1024] * 1024  # an even byte rate over backward (A9)
    return buckets_of(pieces)


# --- validation ----------------------------------------------------------------------------------

def run_label(scheme, hosts, per_host):
    return {"ring": f"{hosts} hosts x 1, ring",
            "hierarchical": f"{hosts} hosts x {per_host}, hierarchical",
            "ps": f"{hosts} hosts x 1 + {hosts} servers, dist_sync"}[scheme]


def predict_run(fit, model, scheme, hosts, per_host, final=True):
    """One validation run: {c_n, straggler, comm, exposed, critical, cpu_bound, predicted}.
    plain: c_N + exposed communication, the link slowed by the CPU share (A6, A8). final: the
    larger of the critical path (c_N + exposed communication slowed by g, A1', A6, A8') and the
    machine's CPU bound (A11)."""
    procs = hosts * per_host
    machine_procs = procs + (hosts if scheme == "ps" else 0)
    c_n = fit.c[model][1] * fit.share(model, procs)
    buckets = fit.buckets(model)
    bf = fit.backward_frac(model)
    out = {"c_n": c_n, "straggler": fit.straggler(model, procs)}
    if not final or fit.slowdown(machine_procs, 1.0) is None:
        link, shm, _ = fit.link_at(model, machine_procs)

        def parts(size):
            return comm_parts(scheme, size, per_host, hosts, link, shm, shared_nic=False)
        out["predicted"], out["exposed"] = step_time(c_n, bf, buckets, parts)
        out["comm"] = sum(sum(parts(b)) for b, _ in buckets)
        out["critical"], out["cpu_bound"] = out["predicted"], 0.0
        return out
    link, link1, shm = (fit.alpha, fit.beta), (fit.alpha, fit.beta1), (fit.alpha_s, fit.beta_s)

    def base(size):  # A1/A1'/A2/A4 with the 2-host parameters: each rank on its own core
        return comm_parts(scheme, size, per_host, hosts, link1 if size <= SEGMENT else link, shm,
                          shared_nic=False)

    def parts(size):  # A8': as slowed on this machine
        g = fit.slowdown(machine_procs, size)
        lat, bw = base(size)
        return lat * g, bw * g
    out["critical"], out["exposed"] = step_time(c_n, bf, buckets, parts)
    out["comm"] = sum(sum(parts(b)) for b, _ in buckets)
    work = sum(base(b)[1] for b, _ in buckets)  # A11: core-seconds of one process's sending
    out["cpu_bound"] = c_n + machine_procs / fit.cores * work
    out["predicted"] = max(out["critical"], out["cpu_bound"])
    return out


def validation_rows(fit):
    """One dict per validation run: the final model's numbers with the medians over rounds,
    and per round the plain and final predictions against that round's measured step."""
    rows = []
    rounds = fit.raw.get("rounds", 1)
    per_round = [Fit(fit.raw, r) for r in range(rounds)] if "link_all" in fit.raw else []
    for model in fit.models:
        for run in fit.raw.get("steps", {}).get(model, []):
            scheme, hosts, per_host = run["scheme"], run["hosts"], run["per_host"]
            row = predict_run(fit, model, scheme, hosts, per_host)
            row.update({"label": run_label(scheme, hosts, per_host), "model": model,
                        "scheme": scheme, "hosts": hosts, "per_host": per_host,
                        "measured": run["step_s"],
                        "measured_all": run.get("all", [run["step_s"]]), "plain": [],
                        "final": []})
            fits = per_round or [fit]
            for r, f in enumerate(fits):
                if r >= len(row["measured_all"]):
                    break
                meas = row["measured_all"][r] if per_round else run["step_s"]
                for kind, final in (("plain", False), ("final", True)):
                    p = predict_run(f, model, scheme, hosts, per_host, final)["predicted"]
                    row[kind].append((p, 100 * (p - meas) / meas))
            rows.append(row)
    return rows


def allreduce_check_rows(fit):
    """Measured allreduce at N hosts x 1 rank against A1/A1' with the 2-host parameters (its
    ratio is the slowdown g of A8'), and against the plain model (the CPU share r, A8)."""
    rows = []
    model = "lenet" if "lenet" in fit.models else (fit.models[0] if fit.models else None)
    for n, sizes in sorted(fit.link.items()):
        for mb, ms in sorted(sizes.items(), key=lambda kv: float(kv[0])):
            size = float(mb) * 1e6
            r = fit.link_at(model, n)[2] if model else 1.0
            plain = t_ring(size, n, fit.alpha * r, fit.beta / r)
            rows.append((n, float(mb), fit.t_model(n, size), r, plain, ms / 1e3))
    return rows


# --- predictions ---------------------------------------------------------------------------------

def predict(fit, hosts_list, rates_gbit, per_host, intra_gbps=None, cap_beta=False):
    """{(model, scheme, rate): [(hosts, efficiency, step_s)]}."""
    beta_s = intra_gbps * 1e9 / 8 if intra_gbps else fit.beta_s
    shm = (fit.alpha_s, beta_s)
    models = {"resnet50": (RESNET50["compute_s"], RESNET50["backward_frac"], resnet_buckets())}
    if "lenet" in fit.models:
        models["lenet"] = (fit.c["lenet"][1], fit.backward_frac("lenet"), fit.buckets("lenet"))
    out = {}
    for model, (c, bf, buckets) in models.items():
        for scheme in SCHEMES:
            for rate in rates_gbit:
                beta = rate * 1e9 / 8
                if cap_beta:
                    beta = min(beta, fit.beta * (per_host if scheme == "hierarchical" else 1))
                link = (fit.alpha, beta)
                pts = []
                for h in hosts_list:
                    step, _ = step_time(c, bf, buckets, lambda s: comm_parts(
                        scheme, s, per_host, h, link, shm))
                    pts.append((h, c / step, step))
                out[(model, scheme, rate)] = pts
    return out


# =================================================================================================
# Measuring
# =================================================================================================

class ManyHosts(Hosts):
    """allreduce_hosts.Hosts (start, kill_children, down) with as many hosts as up_n is given."""

    def up_n(self, n):
        self.count = self.n = n
        return self.up()


def log(msg):
    print(f"# {msg}", file=sys.stderr, flush=True)


def loadavg():
    with open("/proc/loadavg") as f:
        return " ".join(f.read().split()[:3])


class Measure:
    def __init__(self, a, hosts):
        self.a, self.hosts = a, hosts
        self.counter = 0
        self.troupe = a.troupe

    def workdir(self, name):
        self.counter += 1
        d = os.path.join(self.hosts.shared, f"{self.counter:03d}-{name}")
        os.makedirs(d)
        return d

    # --- allreduce -------------------------------------------------------------------------------

    def bench_hosts(self, n, sizes, iters, warmup):
        """troupe bench allreduce, one rank on each of hosts 0..n-1: {mb key: mean ms}."""
        d = self.workdir(f"allreduce-{n}")
        results = os.path.join(d, "results.txt")
        env = {"TROUPE_NUM_WORKERS": n, "TROUPE_RUN_ID": f"sc{self.counter}",
               "TROUPE_RENDEZVOUS": f"file://{d}/store", "TROUPE_SECRET": secrets.token_hex(16)}
        cmd = [self.troupe, "bench", "allreduce", "-n", str(n), "--sizes",
               ",".join(key(s) for s in sizes), "--iters", str(iters), "--warmup", str(warmup),
               "--worker", "--results", results, "--interface", "eth0"]
        procs = [self.hosts.start(r, {**env, "TROUPE_RANK": r}, cmd, f"{d}/rank{r}.log")
                 for r in reversed(range(n))]
        wait_all(procs, 300, f"allreduce on {n} hosts")
        with open(results) as f:
            return parse_bench_rows(f.read(), sizes, f"allreduce on {n} hosts")

    def bench_shm(self, sizes, iters, warmup):
        """troupe bench allreduce -n 2 inside host 0 (shared memory): {mb key: mean ms}."""
        d = self.workdir("allreduce-shm")
        cmd = [self.troupe, "bench", "allreduce", "-n", "2", "--sizes",
               ",".join(key(s) for s in sizes), "--iters", str(iters), "--warmup", str(warmup)]
        p = self.hosts.start(0, {}, cmd, f"{d}/out.log", cwd=d)
        wait_all([p], 300, "allreduce in one host")
        rows = []
        with open(p.log) as f:
            for line in f:
                fields = line.split()
                if len(fields) == 7 and re.fullmatch(r"[0-9.]+", fields[0]):
                    if fields[6] != "OK":
                        raise ToolError(f"allreduce in one host: wrong sums:\n{line}")
                    rows.append(float(fields[2]))
        if len(rows) != len(sizes):
            raise ToolError(f"allreduce in one host: {len(rows)} rows for {len(sizes)} sizes:\n"
                            f"{tail(p.log)}")
        return {key(s): ms for s, ms in zip(sizes, rows)}

    # --- training --------------------------------------------------------------------------------

    def train_flags(self, model, epoch_size, epochs, d, schedule):
        flags = [CONFIG, "--model", model, "--train_data", f"{DATA}/train", "--db_type", "lmdb",
                 "--schedule", schedule, "--epoch_size", str(epoch_size), "--threads", "1",
                 "--num_epochs", str(epochs), "--log_every", "0", "--log_dir", d,
                 "--checkpoint_every", "0", "--checkpoint_dir", d]
        return flags

    def local(self, model, k):
        """k copies of a single-process run at once, one per host: [step seconds per copy] and
        the percentiles of copy 0's step seconds over epochs 2..E-1 (from its trace)."""
        a = self.a
        d = self.workdir(f"local-{model}-{k}")
        procs = []
        for i in range(k):
            di = os.path.join(d, f"p{i}")
            os.makedirs(di)
            cmd = [self.troupe, "train", *self.train_flags(model, a.steps[model] * BATCH,
                                                           a.epochs + 1, di, "local")]
            if i == 0:  # its step times' spread: the stragglers of a synchronous step (A10)
                cmd += ["--trace", os.path.join(di, "run.json")]
            procs.append(self.hosts.start(i, {}, cmd, f"{di}/out.log", cwd=di))
        wait_all(procs, 900, f"{k} local {model} runs")
        steps = []
        for i in range(k):
            rows = read_log(os.path.join(d, f"p{i}"), a.epochs + 1, f"local {model} {i}")
            steps.append(step_of(rows[1:-1], BATCH))
        self.last_trace = os.path.join(d, "p0", "run.json")
        return steps, step_percentiles(self.last_trace, a.epochs + 1)

    def dist(self, model, hosts, per_host=1, scheme="ring", trace=False):
        """troupe launch --launcher ssh over hosts 0..hosts-1: the measured step seconds."""
        a = self.a
        workers = hosts * per_host
        d = self.workdir(f"dist-{model}-{scheme}-{hosts}x{per_host}")
        hostfile = os.path.join(d, "hostfile")
        with open(hostfile, "w") as f:
            f.writelines(f"{addr}\n" for addr in self.hosts.addr[:hosts])
        ssh = [f"--ssh-opt={o}" for o in self.hosts.ssh_opts.split()]
        schedule = "dist_sync" if scheme == "ps" else "bsp-allreduce"
        epochs = 2 if trace else a.epochs
        train = [self.troupe, "train", *self.train_flags(
            model, a.steps[model] * BATCH * workers, epochs, d, schedule), "--interface", "eth0"]
        if scheme == "hierarchical":
            train += ["--allreduce", "hierarchical"]
        elif scheme == "ring":
            train += ["--allreduce", "ring"]
        if trace:
            train += ["--trace", os.path.join(d, "run.json")]
        cmd = [self.troupe, "launch", "--launcher", "ssh", "-H", hostfile, "-n", str(workers),
               *(["-s", str(hosts)] if scheme == "ps" else []), "--interface", "eth0", *ssh,
               "--", *train]
        p = self.hosts.start(0, {}, cmd, f"{d}/launch.out", cwd=d)
        wait_all([p], 900, f"{model} {scheme} on {hosts} hosts x {per_host}")
        rows = read_log(d, epochs, f"{model} {scheme} {hosts}x{per_host}")
        if trace:
            self.last_trace = os.path.join(d, "run.json")
        return step_of(rows[1:], BATCH * workers)


def parse_bench_rows(text, sizes, name):
    out = {}
    for line in text.splitlines():
        f = line.split()
        if len(f) != 5:
            continue
        if int(f[4]):
            raise ToolError(f"{name}: {f[4]} wrong sums at {f[0]} MB")
        out[key(float(f[0]))] = float(f[2])
    missing = [s for s in sizes if key(s) not in out]
    if missing:
        raise ToolError(f"{name}: no result for {missing} MB in:\n{text}")
    return out


def read_log(d, epochs, name):
    logs = [f for f in os.listdir(d) if f.endswith(".log") and f != "out.log"]
    if len(logs) != 1:
        raise ToolError(f"{name}: want one CSV log in {d}, found {logs}")
    with open(os.path.join(d, logs[0])) as f:
        rows = list(csv.DictReader(line for line in f if not line.startswith("#")))
    if len(rows) != epochs:
        raise ToolError(f"{name}: {len(rows)} epochs logged, want {epochs}")
    return rows


def step_of(rows, global_batch):
    rows = rows or []
    inputs = sum(float(r["input_count"]) for r in rows)
    seconds = sum(float(r["time_spent"]) for r in rows)
    return global_batch * seconds / inputs


def parse_trace(path, skip=0.3):
    """From a Chrome trace: worker 0's median forward and backward seconds, its step period, and
    per gradient bucket (in the order sent) the median time it reached the reducer as a fraction
    of backward, its allreduce seconds, and the median exposed communication (last allreduce end
    after backward end)."""
    with open(path) as f:
        events = json.load(f)["traceEvents"]
    names = {e["pid"]: e["args"]["name"] for e in events
             if e.get("ph") == "M" and e.get("name") == "process_name"}
    pid = next((p for p, n in names.items() if n == "worker 0"), min(names) if names else 0)
    spans = {n: sorted((e["ts"], e["dur"]) for e in events
                       if e.get("ph") == "X" and e["pid"] == pid and e["name"] == n)
             for n in ("forward", "backward")}
    fwd, bwd = spans["forward"], spans["backward"]
    first = int(len(fwd) * skip)
    fwd, bwd = fwd[first:], [b for b in bwd if fwd and b[0] >= fwd[0][0]]
    period = statistics.median(b[0] - a[0] for a, b in zip(fwd, fwd[1:]))
    out = {"forward_s": statistics.median(d for _, d in fwd) / 1e6,
           "backward_s": statistics.median(d for _, d in bwd) / 1e6,
           "period_s": period / 1e6, "steps": len(fwd)}
    out["backward_frac"] = out["backward_s"] / out["period_s"]
    begins, ends = {}, {}
    for e in events:
        if e.get("pid") == pid and e.get("cat") == "comm" and e["name"].startswith("allreduce"):
            (begins if e["ph"] == "b" else ends)[e["id"]] = (e["ts"], e["name"])
    per_bucket, exposed = {}, []
    by_step = {}
    for i, (t0, name) in begins.items():
        if i not in ends:
            continue
        t1 = ends[i][0]
        host = [b for b in bwd if b[0] <= t0]
        if not host:
            continue
        b0, bd = host[-1]
        lo = int(re.search(r"\[(\d+),", name).group(1))
        per_bucket.setdefault(lo, []).append(((t0 - b0) / max(bd, 1), (t1 - t0) / 1e6))
        by_step.setdefault(b0, []).append(t1 - (b0 + bd))
    if per_bucket:
        order = sorted(per_bucket, reverse=True)  # backward hands on the last layers first
        out["ready_frac"] = [statistics.median(x[0] for x in per_bucket[lo]) for lo in order]
        out["allreduce_s"] = [statistics.median(x[1] for x in per_bucket[lo]) for lo in order]
        exposed = [max(0.0, max(v)) / 1e6 for v in by_step.values()]
        out["exposed_s"] = statistics.median(exposed)
    return out


def step_percentiles(path, epochs):
    """Percentiles 0, 1, .., 100 of the seconds between successive forward passes of worker 0,
    over epochs 2..E-1 of E (as the step times of the log)."""
    with open(path) as f:
        events = json.load(f)["traceEvents"]
    starts = sorted(e["ts"] for e in events if e.get("ph") == "X" and e["name"] == "forward")
    n = len(starts)
    window = starts[n // epochs: n - n // epochs]
    d = sorted((b - a) / 1e6 for a, b in zip(window, window[1:]))
    return [round(d[min(len(d) - 1, round(i / 100 * (len(d) - 1)))], 7) for i in range(101)]


def wait_for_others(minutes):
    deadline = time.monotonic() + minutes * 60
    while True:
        ns = subprocess.run(["ip", "netns", "list"], stdout=subprocess.PIPE, text=True).stdout
        busy = [line.split()[0] for line in ns.splitlines()
                if re.match(r"(bh|bt)-", line)]
        if not busy:
            return
        if time.monotonic() > deadline:
            raise ToolError(f"namespaces {busy} still there after {minutes} minutes")
        log(f"waiting for another benchmark's namespaces to go: {' '.join(busy)}")
        time.sleep(30)


def measure(a):
    raw = {"when": datetime.datetime.now().isoformat(timespec="seconds"),
           "machine": f"{os.cpu_count()} CPUs ({cpu_name()}), Linux {platform.release()}",
           "rounds": a.rounds, "steps_per_epoch": a.steps, "epochs": a.epochs,
           "link": {}, "shm": {}, "compute": {}, "compute_all": {}, "steps": {}, "trace": {},
           "load": []}
    n_max = max(a.hosts_list)
    hosts = ManyHosts(a.prefix, a.subnet)

    interrupt_on_termination()
    try:
        log(hosts.up_n(n_max).replace("\n", "\n# "))
        m = Measure(a, hosts)
        small = [TINY_MB] + [round(grad_mb(x), 3) for x in a.models]
        link = {}  # n -> mb -> [ms]
        shm = {}
        compute = {}  # model -> k -> [s]
        jitter = {}  # model -> k -> [percentiles of step s]
        steps = {}  # (model, scheme, hosts, per_host) -> [s]
        for r in range(a.rounds):
            log(f"round {r + 1}/{a.rounds}: allreduce; load average {loadavg()}")
            for n in a.hosts_list:
                sizes = small + (list(LINK_BIG_MB) if n == 2 else [25.0])
                rows = m.bench_hosts(n, sizes, a.iters, a.warmup)
                for mb, ms in rows.items():
                    link.setdefault(str(n), {}).setdefault(mb, []).append(ms)
                log(f"  {n} hosts: " + "  ".join(f"{mb} MB {ms:.3f} ms" for mb, ms in rows.items()))
            rows = m.bench_shm(small + list(LINK_BIG_MB), a.iters, a.warmup)
            for mb, ms in rows.items():
                shm.setdefault(mb, []).append(ms)
            log("  shared memory: " + "  ".join(f"{mb} MB {ms:.3f} ms" for mb, ms in rows.items()))
            for model in a.models:
                for k in [1] + [n for n in a.hosts_list if n > 1]:
                    t0, i0 = cpu_times()
                    s, q = m.local(model, k)
                    t1, i1 = cpu_times()
                    compute.setdefault(model, {}).setdefault(k, []).append(s)
                    jitter.setdefault(model, {}).setdefault(k, []).append(q)
                    log(f"  {model} x{k} local: step {statistics.mean(s) * 1e3:.1f} ms "
                        f"[{min(s) * 1e3:.1f}-{max(s) * 1e3:.1f}]; CPUs "
                        f"{100 * (1 - (i1 - i0) / max(1, t1 - t0)):.0f}% busy")
                runs = [("ring", n, 1) for n in a.hosts_list]
                if a.extra and 4 in a.hosts_list:
                    runs += [("hierarchical", 2, 2), ("ps", 2, 1)]
                for scheme, n, per in runs:
                    s = m.dist(model, n, per, scheme)
                    steps.setdefault((model, scheme, n, per), []).append(s)
                    log(f"  {model} {scheme} {n} hosts x {per}: step {s * 1e3:.1f} ms; load "
                        f"average {loadavg()}")
            raw["load"].append(loadavg())
        log("traces")
        for model in a.models:
            m.local(model, 1)
            raw["trace"][model] = parse_trace(m.last_trace)
            m.dist(model, 2, 1, "ring", trace=True)
            t2 = parse_trace(m.last_trace)
            raw["trace"][model].update({k: t2[k] for k in ("ready_frac", "allreduce_s",
                                                            "exposed_s") if k in t2})
            raw["trace"][model]["two_host_period_s"] = t2["period_s"]
            log(f"  {model}: {json.dumps(raw['trace'][model])}")
    except KeyboardInterrupt:
        log("interrupted")
        raise SystemExit(130)
    finally:
        take_down(hosts)
    med = statistics.median
    raw["link"] = {n: {mb: med(v) for mb, v in d.items()} for n, d in link.items()}
    raw["shm"] = {mb: med(v) for mb, v in shm.items()}
    raw["compute"] = {model: {str(k): med(statistics.mean(x) for x in v) for k, v in d.items()}
                      for model, d in compute.items()}
    raw["compute_all"] = {model: {str(k): [[round(s, 6) for s in x] for x in v]
                                  for k, v in d.items()} for model, d in compute.items()}
    raw["jitter"] = {model: {str(k): v for k, v in d.items()} for model, d in jitter.items()}
    raw["link_all"] = link
    raw["shm_all"] = shm
    for (model, scheme, n, per), v in steps.items():
        raw["steps"].setdefault(model, []).append(
            {"scheme": scheme, "hosts": n, "per_host": per, "step_s": med(v), "all": v})
    return raw


def cpu_name():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "?"


# =================================================================================================
# Reporting
# =================================================================================================

def fmt_ms(s):
    return f"{s * 1e3:.2f}"


def report(fit, a):
    """The text of the tables, as a list of markdown lines (also printed)."""
    raw = fit.raw
    L = []
    L.append(f"Measured {raw['when']} on {raw['machine']}; median over {raw['rounds']} round(s); "
             f"steps an epoch {raw['steps_per_epoch']}, epochs 2..{raw['epochs']}.")
    L.append("")
    L.append("### Fitted parameters")
    L.append("")
    L.append("| parameter | value | from |")
    L.append("|---|---|---|")
    L.append(f"| alpha (link, a ring step) | {fit.alpha * 1e6:.0f} us | 2 hosts, "
             f"{key(TINY_MB)} MB: {raw['link']['2'][key(TINY_MB)]:.3f} ms / 2 |")
    L.append(f"| beta (link, one rank sends) | {fit.beta / 1e9:.3f} GB/s "
             f"({fit.beta * 8 / 1e9:.1f} Gbit/s) | 2 hosts: " + ", ".join(
                 f"{mb:g} MB {raw['link']['2'][key(mb)]:.2f} ms -> {b / 1e9:.3f} GB/s"
                 for mb, b in fit.betas.items()) + " |")
    L.append(f"| beta_1 (link, a bucket of one ring segment) | {fit.beta1 / 1e9:.3f} GB/s | "
             "2 hosts: " + ", ".join(f"{mb:g} MB {raw['link']['2'][key(mb)]:.2f} ms -> "
                                     f"{b / 1e9:.3f} GB/s" for mb, b in fit.betas1.items())
             + " (A1', final model only) |")
    L.append(f"| alpha_s (shared memory) | {fit.alpha_s * 1e6:.0f} us | 1 host, 2 processes, "
             f"{key(TINY_MB)} MB: {raw['shm'][key(TINY_MB)]:.3f} ms / 2 |")
    L.append(f"| beta_s (shared memory) | {fit.beta_s / 1e9:.3f} GB/s | 1 host: " + ", ".join(
        f"{mb:g} MB {raw['shm'][key(mb)]:.2f} ms -> {b / 1e9:.3f} GB/s"
        for mb, b in fit.betas_s.items()) + " |")
    for model in fit.models:
        cs = fit.c[model]
        L.append(f"| c, {model} (1 process alone) | {cs[1] * 1e3:.2f} ms | "
                 f"{BATCH / cs[1]:.0f} inputs/s, batch {BATCH}, 1 thread |")
        L.append(f"| CPU share c_k/c_1, {model} | " + ", ".join(
            f"k={k}: {cs[k] / cs[1]:.2f}" for k in sorted(cs)) + " | k processes training at "
            "once (max(1, k/2) would be " + ", ".join(f"{max(1, k / 2):g}" for k in sorted(cs))
            + ") |")
        t = fit.traces.get(model, {})
        if t:
            b = fit.buckets(model)
            L.append(f"| backward / step, {model} | {fit.backward_frac(model):.2f} | "
                     f"trace of 1 process: forward {fmt_ms(t['forward_s'])} ms, backward "
                     f"{fmt_ms(t['backward_s'])} ms, step {fmt_ms(t['period_s'])} ms |")
            L.append(f"| buckets, {model} | " + ", ".join(
                f"{s / 1e6:.3f} MB at {f:.2f}" for s, f in b) + " of backward | A5; ready "
                "times from the 2-host trace" + (
                    f" (exposed there: {fmt_ms(t['exposed_s'])} ms)" if "exposed_s" in t else "")
                + " |")
    L.append("")
    L.append("### Allreduce: model vs `troupe bench allreduce`, N hosts x 1 rank")
    L.append("")
    L.append("A1/A1': the ring formula with the 2-host alpha, beta (beta_1 for one segment), as "
             "if each rank had its own core; g = measured / that: the slowdown of N ranks on this "
             "machine's 2 cores, which the final model uses (A8'). plain: the 2-host alpha, beta "
             "slowed by the compute's CPU share r (A8).")
    L.append("")
    L.append("| N | MB | measured ms | A1/A1' ms | g | plain ms (r) | plain error |")
    L.append("|---|---|---|---|---|---|---|")
    for n, mb, model_t, r, plain, meas in allreduce_check_rows(fit):
        L.append(f"| {n} | {mb:g} | {meas * 1e3:.3f} | {model_t * 1e3:.3f} | "
                 f"{meas / model_t:.2f} | {plain * 1e3:.3f} ({r:.2f}) | "
                 f"{100 * (plain - meas) / meas:+.0f}% |")
    L.append("")
    L.append("### Validation: step time, model vs measured")
    L.append("")
    L.extend(validation_lines(fit))
    for i, earlier in enumerate(raw.get("earlier", [])):
        f = Fit(earlier)
        L.append(f"### The same check on an earlier run ({earlier['when']}, "
                 f"{earlier['rounds']} rounds, a noisier state of the machine)")
        L.append("")
        c1 = ", ".join(f"{m} {f.c[m][1] * 1e3:.2f} ms" for m in f.models)
        shares = "; ".join(f"{m} " + ", ".join(f"{f.c[m][k] / f.c[m][1]:.2f}"
                                                for k in sorted(f.c[m])) for m in f.models)
        L.append(f"Its own fitted parameters: alpha {f.alpha * 1e6:.0f} us, beta "
                 f"{f.beta / 1e9:.3f} GB/s, beta_1 {f.beta1 / 1e9:.3f} GB/s; c_1 {c1}; CPU "
                 f"share (k = 1, 2, 4, 8) {shares}. Raw numbers: `earlier` in the JSON block.")
        L.append("")
        L.extend(validation_lines(f))
    pred = predict(fit, a.predict_hosts, a.rates, a.per_host, a.intra_gbps)
    L.append(f"### Predicted efficiency (compute / step time), {a.per_host} processes (GPUs) per "
             f"host")
    L.append("")
    L.append("ResNet-50: S = 102.4 MB, c = 85 ms; LeNet-sized: S = 1.72 MB, c = "
             + (f"{fit.c['lenet'][1] * 1e3:.1f} ms" if "lenet" in fit.c else "-")
             + f"; alpha {fit.alpha * 1e6:.0f} us, in-host beta_s "
             + (f"{a.intra_gbps:g} Gbit/s" if a.intra_gbps else f"{fit.beta_s / 1e9:.2f} GB/s")
             + " (A9).")
    L.append("")
    L.extend(prediction_table(pred, a.predict_hosts, a.rates))
    capped = predict(fit, a.predict_hosts, a.rates, a.per_host, a.intra_gbps, cap_beta=True)
    L.append("")
    L.append(f"Sensitivity: the same with each process's link capped at the beta measured here "
             f"({fit.beta * 8 / 1e9:.1f} Gbit/s; troupe's TCP path on one core), ResNet-50:")
    L.append("")
    L.extend(prediction_table({k: v for k, v in capped.items() if k[0] == "resnet50"},
                              a.predict_hosts, a.rates))
    nvlink = predict(fit, a.predict_hosts, a.rates, a.per_host, intra_gbps=1600)
    L.append("")
    L.append("Sensitivity: in-host stages at 200 GB/s (NVLink-class, `--intra-gbps 1600`) instead "
             f"of the shared memory's {fit.beta_s / 1e9:.2f} GB/s, ResNet-50:")
    L.append("")
    L.extend(prediction_table({k: v for k, v in nvlink.items() if k[0] == "resnet50"},
                              a.predict_hosts, a.rates))
    return L, pred


def validation_lines(fit):
    """The validation table and its summary lines (markdown)."""
    L = []
    rows = validation_rows(fit)
    L.append("Each round's runs against the same round's compute and link measurements; error = "
             "median over rounds [min, max]. plain: the model as first specified: c_N + the "
             "communication not hidden behind backward, the link slowed by the CPU share (A6, "
             "A8). final: the larger of the critical path (c_N + exposed communication with "
             "beta_1 for one-segment buckets and slowed by g as the bench measured at N: A1', "
             "A6, A8') and the CPU bound (A11: c_N + P/2 x each process's core-seconds of "
             "sending). c_N, exposed, bounds: with the medians over rounds. m: the straggler "
             "factor of A10, measured, not used.")
    L.append("")
    L.append("| model | run | c_N ms | exposed ms | critical path ms | CPU bound ms | m | "
             "measured ms [min-max] | plain ms | plain error | final ms | final error | "
             "efficiency measured / final |")
    L.append("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    summary = {"plain": [], "final": []}

    def err_cell(v):
        e = [x[1] for x in v]
        return f"{statistics.median(e):+.1f}% [{min(e):+.0f}, {max(e):+.0f}]"
    for r in rows:
        meas = r["measured"]
        for kind in summary:
            summary[kind].append((r["model"], r["label"], statistics.median(x[1] for x in r[kind])))
        fin = statistics.median(x[0] for x in r["final"])
        L.append(f"| {r['model']} | {r['label']} | {fmt_ms(r['c_n'])} | {fmt_ms(r['exposed'])} | "
                 f"{fmt_ms(r['critical'])} | {fmt_ms(r['cpu_bound'])} | {r['straggler']:.2f} | "
                 f"{fmt_ms(meas)} [{fmt_ms(min(r['measured_all']))}-"
                 f"{fmt_ms(max(r['measured_all']))}] | "
                 f"{fmt_ms(statistics.median(x[0] for x in r['plain']))} | "
                 f"{err_cell(r['plain'])} | {fmt_ms(fin)} | {err_cell(r['final'])} | "
                 f"{100 * r['c_n'] / meas:.0f}% / {100 * r['c_n'] / fin:.0f}% |")
    for kind, errs in summary.items():
        if not errs:
            continue
        worst = max(errs, key=lambda e: abs(e[2]))
        within = sum(abs(e[2]) <= 15 for e in errs)
        mean_abs = statistics.mean(abs(e[2]) for e in errs)
        L.append("")
        L.append(f"{kind}: {within} of {len(errs)} runs within 15% (median error over rounds); "
                 f"mean |error| {mean_abs:.1f}%; worst {worst[2]:+.1f}% ({worst[0]}, "
                 f"{worst[1]}).")
    L.append("")
    return L


def prediction_table(pred, hosts_list, rates, models=None, schemes=SCHEMES):
    out = ["| model | scheme | Gbit/s | " + " | ".join(str(h) for h in hosts_list) + " |",
           "|---|---|---|" + "---|" * len(hosts_list)]
    for model in (models or ("resnet50", "lenet")):
        for scheme in schemes:
            for rate in rates:
                pts = pred.get((model, scheme, rate))
                if not pts:
                    continue
                out.append(f"| {'ResNet-50' if model == 'resnet50' else 'LeNet'} | "
                           f"{SCHEME_NAME[scheme]} | {rate:g} | "
                           + " | ".join(f"{100 * e:.0f}%" for _, e, _ in pts) + " |")
    return out


# --- the SVG -------------------------------------------------------------------------------------

def write_svg(path, fit, pred, rates):
    W, H = 900, 520
    x0, x1, y0, y1 = 70, 610, 40, 460  # plot area: left, right, top, bottom

    def px(h):
        return x0 + (math.log2(h) - 0.75) / 7.5 * (x1 - x0)  # 2 .. 256, with a margin

    def py(e):
        return y1 - max(0.0, min(1.0, e)) * (y1 - y0)
    colors = {"ring": "#1f77b4", "hierarchical": "#2ca02c", "ps": "#d62728"}
    dashes = {rates[0]: "2,4", rates[1]: "8,4"} if len(rates) >= 3 else {}
    s = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" '
         f'viewBox="0 0 {W} {H}" font-family="sans-serif" font-size="12">',
         f'<rect width="{W}" height="{H}" fill="white"/>',
         f'<text x="{(x0 + x1) / 2}" y="22" text-anchor="middle" font-size="15">troupe: '
         f'predicted efficiency of ResNet-50 (8 GPUs a host) and measured runs here</text>']
    for i in range(0, 11):
        e = i / 10
        s.append(f'<line x1="{x0}" y1="{py(e):.1f}" x2="{x1}" y2="{py(e):.1f}" '
                 f'stroke="#ddd"/>')
        s.append(f'<text x="{x0 - 6}" y="{py(e) + 4:.1f}" text-anchor="end">{i * 10}%</text>')
    for k in range(1, 9):
        h = 2 ** k
        s.append(f'<line x1="{px(h):.1f}" y1="{y0}" x2="{px(h):.1f}" y2="{y1}" stroke="#eee"/>')
        s.append(f'<text x="{px(h):.1f}" y="{y1 + 16}" text-anchor="middle">{h}</text>')
    s.append(f'<rect x="{x0}" y="{y0}" width="{x1 - x0}" height="{y1 - y0}" fill="none" '
             f'stroke="black"/>')
    s.append(f'<text x="{(x0 + x1) / 2}" y="{y1 + 36}" text-anchor="middle">hosts (log2 scale)'
             f'</text>')
    s.append(f'<text transform="translate(20,{(y0 + y1) / 2}) rotate(-90)" text-anchor="middle">'
             f'efficiency = compute time / step time</text>')
    legend = []
    for scheme in SCHEMES:
        for rate in rates:
            pts = pred.get(("resnet50", scheme, rate))
            if not pts:
                continue
            d = " ".join(f"{px(h):.1f},{py(e):.1f}" for h, e, _ in pts)
            dash = f' stroke-dasharray="{dashes[rate]}"' if rate in dashes else ""
            s.append(f'<polyline points="{d}" fill="none" stroke="{colors[scheme]}" '
                     f'stroke-width="2"{dash}/>')
            for h, e, _ in pts:
                s.append(f'<circle cx="{px(h):.1f}" cy="{py(e):.1f}" r="2.5" '
                         f'fill="{colors[scheme]}"/>')
            legend.append(("line", colors[scheme], dash,
                           f"ResNet-50, {SCHEME_NAME[scheme]}, {rate:g} Gbit/s"))
    marks = {"lenet": "circle", "mlp": "square"}
    offsets = {("lenet", "black"): -10, ("lenet", "white"): -3, ("mlp", "black"): 3,
               ("mlp", "white"): 10}
    for r in validation_rows(fit):
        if r["scheme"] != "ring":
            continue
        final = statistics.median(x[0] for x in r["final"])
        for e, fill in ((r["c_n"] / r["measured"], "black"), (r["c_n"] / final, "white")):
            x, y = px(r["hosts"]) + offsets.get((r["model"], fill), 0), py(e)
            if marks.get(r["model"]) == "square":
                s.append(f'<rect x="{x - 4:.1f}" y="{y - 4:.1f}" width="8" height="8" '
                         f'fill="{fill}" stroke="black"/>')
            else:
                s.append(f'<circle cx="{x:.1f}" cy="{y:.1f}" r="4.5" fill="{fill}" '
                         f'stroke="black"/>')
    for model in fit.models:
        for fill, what in (("black", "measured"), ("white", "model")):
            legend.append((marks.get(model, "circle"), fill, "",
                           f"{'LeNet' if model == 'lenet' else 'MLP'} here, {what} (N hosts "
                           f"on 2 cores)"))
    lx, ly = x1 + 18, y0 + 6
    for kind, color, dash, text in legend:
        if kind == "line":
            s.append(f'<line x1="{lx}" y1="{ly}" x2="{lx + 28}" y2="{ly}" stroke="{color}" '
                     f'stroke-width="2"{dash}/>')
        elif kind == "square":
            s.append(f'<rect x="{lx + 10}" y="{ly - 4}" width="8" height="8" fill="{color}" '
                     f'stroke="black"/>')
        else:
            s.append(f'<circle cx="{lx + 14}" cy="{ly}" r="4.5" fill="{color}" stroke="black"/>')
        s.append(f'<text x="{lx + 34}" y="{ly + 4}" font-size="11">{text}</text>')
        ly += 19
    s.append("</svg>")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        f.write("\n".join(s) + "\n")


# --- the results file ----------------------------------------------------------------------------

def write_results(path, lines, raw, command):
    text = ["# troupe scaling: measurements, model check and predictions",
            "",
            "Written by `bench/scaling.py` (its docstring lists the model's assumptions A1-A11). "
            "Raw numbers are in the JSON block at the end, which "
            "`python3 bench/scaling.py --from bench/scaling_results.md` reads back.",
            "",
            f"Command: `{command}`",
            "",
            *lines,
            "",
            "## Raw measurements",
            "",
            "link: N hosts -> MB -> mean ms (slowest rank); shm: 2 processes of one host; "
            "compute: model -> k concurrent processes -> step s; steps: measured step s per run; "
            "trace: from `--trace`.",
            "",
            "```json",
            json.dumps(raw, indent=1, sort_keys=True),
            "```",
            ""]
    with open(path, "w") as f:
        f.write("\n".join(text))


def read_raw(path):
    with open(path) as f:
        text = f.read()
    m = re.search(r"```json\n(.*?)\n```", text, re.S)
    if not m:
        sys.exit(f"{path}: no JSON block of raw measurements")
    return json.loads(m.group(1))


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--troupe", default=os.path.join(ROOT, "build/bin/troupe"))
    p.add_argument("--from", dest="from_file", help="refit from a results file; measure nothing")
    p.add_argument("--hosts", default="2,4,8", help="validation runs: hosts x 1 process")
    p.add_argument("--models", default="lenet,mlp")
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--steps", default="lenet=200,mlp=1500",
                   help="steps an epoch, per model (about 1.3 s and 0.5 s of one process alone)")
    p.add_argument("--epochs", type=int, default=4, help="epochs of a run (the first is warm-up)")
    p.add_argument("--iters", type=int, default=20, help="allreduce bench: timed iterations")
    p.add_argument("--warmup", type=int, default=5, help="allreduce bench: warm-up iterations")
    p.add_argument("--extra", action="store_true",
                   help="also 2 hosts x 2 hierarchical and 2 hosts dist_sync runs")
    p.add_argument("--prefix", default="sc")
    p.add_argument("--subnet", default="10.81.0")
    p.add_argument("--wait-minutes", type=float, default=25,
                   help="wait this long for bh-*/bt-* namespaces (another benchmark) to go")
    p.add_argument("--per-host", type=int, default=8, help="predictions: processes per host")
    p.add_argument("--rates", default="10,25,100", help="predictions: Gbit/s")
    p.add_argument("--predict-hosts", default="8,16,32,64,128,256")
    p.add_argument("--intra-gbps", type=float, help="predictions: in-host beta_s (default: "
                   "measured shared memory)")
    p.add_argument("--results", default=RESULTS)
    p.add_argument("--svg", default=SVG)
    p.add_argument("--no-write", action="store_true", help="print only")
    a = p.parse_args()
    a.hosts_list = sorted({2, *(int(x) for x in a.hosts.split(","))})
    a.models = a.models.split(",")
    a.steps = {k: int(v) for k, v in (x.split("=") for x in a.steps.split(","))}
    a.rates = [float(x) for x in a.rates.split(",")]
    a.predict_hosts = [int(x) for x in a.predict_hosts.split(",")]
    if any(mdl not in LAYERS or mdl not in a.steps for mdl in a.models):
        sys.exit(f"--models: some of {','.join(LAYERS)}")

    if a.from_file:
        raw = read_raw(a.from_file)
        command = raw.get("command", "")
    else:
        if os.geteuid() != 0:
            sys.exit("must run as root (hosts.sh makes network namespaces, bridges and mounts)")
        if not os.access(a.troupe, os.X_OK):
            sys.exit(f"{a.troupe} is missing: flock /tmp/troupe-build.lock ninja -C build -j2 "
                     "troupe_cli")
        if not os.path.isdir(os.path.join(DATA, "train")):
            sys.exit(f"{DATA}/train is missing (the test data: build the tests' data)")
        try:
            wait_for_others(a.wait_minutes)
            raw = measure(a)
        except ToolError as e:
            log(str(e))
            return 1
        command = "sudo python3 bench/scaling.py " + " ".join(sys.argv[1:])
        raw["command"] = command
    fit = Fit(raw)
    lines, pred = report(fit, a)
    print("\n".join(lines))
    if not a.no_write:
        write_results(a.results, lines, raw, command)
        write_svg(a.svg, fit, pred, a.rates)
        print(f"\n# wrote {a.results} and {a.svg}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
