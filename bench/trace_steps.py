#!/usr/bin/env python3
"""Where a traced `troupe train` step's time goes on its device: from a trace (--trace FILE),
each replica's device track (its forward and backward spans, timed by the device's events), per
step: the device's busy time (the forward's start to the last backward piece's end), the period
(one forward's start to the next's) and the gap between them (the device waiting for the host:
the step's end seen by the host, the update, the next step's queueing).

    python3 bench/trace_steps.py trace.json [--skip 5] [--batch 256]

Medians over the steps after --skip (the first ones warm up); with --batch, images/s at the
device's busy pace and at the period's, to set beside troupe_kernels_bench's figure.
"""
import argparse
import json
import statistics
import sys


def device_steps(events, tid):
    """[(start, end)] in microseconds of each step on the track tid: a step opens at a forward."""
    spans = sorted((e["ts"], e["ts"] + e["dur"], e["name"]) for e in events
                   if e.get("ph") == "X" and e.get("tid") == tid)
    steps = []
    for start, end, name in spans:
        if name == "forward" or not steps:
            steps.append([start, end])
        else:
            steps[-1][1] = max(steps[-1][1], end)
    return steps


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("trace")
    ap.add_argument("--skip", type=int, default=5, help="steps left out at the start")
    ap.add_argument("--batch", type=int, default=0, help="a replica's batch, for images/s")
    a = ap.parse_args()
    with open(a.trace) as f:
        trace = json.load(f)
    events = trace["traceEvents"] if isinstance(trace, dict) else trace
    tracks = {(e.get("pid"), e["tid"]): e["args"]["name"] for e in events
              if e.get("ph") == "M" and e.get("name") == "thread_name"}
    found = False
    for (pid, tid), name in sorted(tracks.items(), key=lambda kv: str(kv)):
        if " cuda:" not in name:
            continue
        steps = device_steps([e for e in events if e.get("pid") == pid], tid)[a.skip:]
        if len(steps) < 3:
            print(f"{name}: {len(steps)} steps after the first {a.skip}: too few")
            continue
        found = True
        busy = statistics.median(end - start for start, end in steps) / 1000
        period = statistics.median(b[0] - s[0] for s, b in zip(steps, steps[1:])) / 1000
        gap = statistics.median(b[0] - s[1] for s, b in zip(steps, steps[1:])) / 1000
        line = (f"{name}: {len(steps)} steps, median device busy {busy:.2f} ms, period "
                f"{period:.2f} ms, gap {gap:.2f} ms ({100 * gap / period:.1f}% of the period)")
        if a.batch:
            line += (f"; {1000 * a.batch / busy:.0f} images/s at the busy pace, "
                     f"{1000 * a.batch / period:.0f} at the period's")
        print(line)
    if not found:
        print("no device track with steps in the trace (a CPU run, or too short)")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
