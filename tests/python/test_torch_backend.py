"""troupe.torch's torch.distributed backend ("troupe") against gloo: every collective on random
tensors of odd sizes, bad calls refused, and DDP's 20 steps (tests/python/torch_backend_worker.py),
in 3 ranks started by `troupe launch` and in 2 started with torchrun's variables alone."""
import os
import socket
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
WORKER = os.path.join(HERE, "torch_backend_worker.py")
COMMON = ["ok allreduce", "ok broadcast", "ok allgather", "ok reduce_scatter barrier",
          "ok all_gather_into_tensor reduce_scatter_tensor avg", "ok alltoall", "ok send recv",
          "ok subgroups", "refused: troupe backend: recv from any source is not supported yet",
          "ok ddp relative difference"]
# The C++ backend (csrc/c10d.cc, the default) and the Python process group
# (TROUPE_TORCH_BACKEND=python).
CHECKS = COMMON + [
    "backend c++", "ok other reductions reduce gather scatter",
    "refused: troupe backend: allreduce with ReduceOp.AVG of a Long tensor: AVG takes "
    "floating-point tensors",
    "refused: troupe backend: allreduce with ReduceOp.BAND of a Float tensor: the bitwise "
    "reductions take integers and bools"]
PYTHON_CHECKS = COMMON + [
    "backend python",
    "refused: troupe backend: allreduce of a torch.float64 tensor",
    "refused: troupe backend: allreduce with ReduceOp.MAX: only ReduceOp.SUM and AVG for now"]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def torchrun_ranks(args, world=2):
    """Runs `python ARGS` as every rank of `world`, placed by torchrun's variables alone
    (MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE, LOCAL_RANK; no TROUPE_* variable, so rank 0 serves
    troupe's rendezvous and tells the others through torch's store): exit codes and outputs."""
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("TROUPE_")}
    procs = [subprocess.Popen([sys.executable, *args], stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True,
                              env=dict(env, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
                                       RANK=str(rank), WORLD_SIZE=str(world),
                                       LOCAL_RANK=str(rank)))
             for rank in range(world)]
    outs = [p.communicate(timeout=240)[0] for p in procs]
    return [p.returncode for p in procs], outs


def troupe_program(timeout, *lines):
    """A rank's program (for python -c): torch.distributed's group on the "troupe" backend, its
    waits ending after `timeout` seconds, then `lines` (with datetime, os, time, torch and
    torch.distributed as dist imported)."""
    return "\n".join(["import datetime, os, time, torch, torch.distributed as dist, troupe.torch",
                      "dist.init_process_group('troupe', "
                      f"timeout=datetime.timedelta(seconds={timeout}))", *lines, ""])


def test_three_ranks_started_by_troupe_launch():
    r = subprocess.run([os.environ.get("TROUPE", "troupe"), "launch", "-n", "3", "--",
                        sys.executable, WORKER],
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=240)
    assert r.returncode == 0, r.stdout
    for rank in range(3):
        for check in CHECKS:
            assert f"[worker {rank}] {check}" in r.stdout, (check, r.stdout)


def test_the_python_process_group_where_asked():
    r = subprocess.run([os.environ.get("TROUPE", "troupe"), "launch", "-n", "2", "--",
                        sys.executable, WORKER],
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=240,
                       env=dict(os.environ, TROUPE_TORCH_BACKEND="python"))
    assert r.returncode == 0, r.stdout
    for rank in range(2):
        for check in PYTHON_CHECKS:
            assert f"[worker {rank}] {check}" in r.stdout, (check, r.stdout)


def test_four_ranks_sum_hundreds_of_megabytes_of_changing_sizes():
    # 336 MB, 84 MB, 336 MB a rank, three times over: each collective's start sends a chunk for
    # each of its segments (84) while the previous rank's arrive, filling the ring member's
    # mailbox (64). A chunk the transport copied at once was released on the member's own thread,
    # whose note to itself then waited for room in that full mailbox: the run failed, 30 s later
    # ("its mailbox stayed full"), until such notes went unbounded (actors/core/system.cc).
    # Values: small integers, summed exactly.
    program = troupe_program(
        60, "torch.set_num_threads(1)",
        "r, w = dist.get_rank(), dist.get_world_size()",
        "for n in (84_000_000, 21_000_000) * 3:",
        "    t = torch.full((n,), float(r + 1))",
        "    dist.all_reduce(t)",
        "    assert bool((t == w * (w + 1) / 2).all()), (n, t[:4])",
        "    del t",
        "print('summed every size', flush=True)")
    r = subprocess.run([os.environ.get("TROUPE", "troupe"), "launch", "-n", "4", "--",
                        sys.executable, "-c", program],
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=240)
    assert r.returncode == 0, r.stdout
    for rank in range(4):
        assert f"[worker {rank}] summed every size" in r.stdout, r.stdout


def test_two_ranks_placed_by_torchruns_variables():
    # What torchrun gives each rank (its launcher itself fails under Debian's Python 3.11).
    codes, outs = torchrun_ranks([WORKER])
    for code, out in zip(codes, outs):
        assert code == 0, out
        for check in CHECKS:
            assert check in out, (check, out)


def test_a_rank_that_never_comes_ends_the_wait_naming_it():
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("TROUPE_")}
    # Rank 1 joins torch's store (torch 2 waits there for every rank before it calls a backend)
    # and goes no further: rank 0 then waits for it in troupe's rendezvous.
    stand_in = subprocess.Popen(
        [sys.executable, "-c",
         "import datetime, time, torch.distributed as dist\n"
         f"s = dist.TCPStore('127.0.0.1', {port}, 2, False, datetime.timedelta(seconds=60))\n"
         "time.sleep(60)\n"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        r = subprocess.run([sys.executable, "-c", troupe_program(3)], stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, text=True, timeout=120,
                           env=dict(env, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
                                    RANK="0", WORLD_SIZE="2", LOCAL_RANK="0"))
    finally:
        stand_in.kill()
        stand_in.wait()
    assert r.returncode != 0, r.stdout
    assert "timed out after 3 s waiting for worker 1 (rank 1 of 2)" in r.stdout, r.stdout


def test_a_recv_whose_send_never_comes_fails_naming_the_rank():
    # Both ranks meet (a 4 s timeout, which init_process_group gives the group's waits); rank 1
    # then sends nothing (staying a little longer than the timeout), and rank 0's recv ends at
    # the timeout naming it.
    program = troupe_program(
        4, "dist.barrier()",
        "if dist.get_rank() == 0:",
        "    dist.recv(torch.zeros(4), src=1, tag=5)",
        "else:",
        "    time.sleep(6)")
    codes, outs = torchrun_ranks(["-c", program])
    assert codes[0] != 0, outs[0]
    assert "recv timed out after 4 s waiting for rank 1 (tag 5)" in outs[0], outs[0]


def test_a_rank_that_dies_mid_ddp_ends_the_others_backward_naming_it():
    # Rank 1 exits before its fourth backward; rank 0's bucket sum (on the backend's own thread)
    # fails on the lost link, and DDP's backward raises that error: exit 1, neither a hang nor a
    # crash (a Work whose future holds a Python exception object made DDP crash: a signal).
    program = troupe_program(
        10, "torch.manual_seed(0)",
        "model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(50, 10))",
        "for step in range(10):",
        "    if dist.get_rank() == 1 and step == 3:",
        "        os._exit(3)",
        "    model(torch.randn(8, 50)).sum().backward()",
        "    print('step', step, 'done', flush=True)")
    codes, outs = torchrun_ranks(["-c", program])
    assert codes[1] == 3, outs[1]
    assert codes[0] == 1, outs[0]
    assert "step 2 done" in outs[0] and "step 3 done" not in outs[0], outs[0]
    assert "lost the link to worker 1" in outs[0], outs[0]


def test_tensors_of_other_sizes_across_ranks_are_refused_naming_both():
    # dist.all_reduce of 10 values on rank 0 and 12 on rank 1: each is refused by the first chunk
    # of the other's, naming both sizes (or, if its partner failed first, naming that partner).
    # No rank returns a tensor it summed alone (the call returns only once its Work is waited
    # for, which raises).
    program = troupe_program(
        5, "t = torch.ones(10 if dist.get_rank() == 0 else 12)",
        "dist.all_reduce(t)",
        "print('all_reduce returned', t.tolist(), flush=True)")
    codes, outs = torchrun_ranks(["-c", program])
    assert codes[1] != 0 and "all_reduce returned" not in outs[1], outs[1]
    assert "rank 0 sums 10 values at 0, this rank 12: the ranks' sizes differ" in outs[1], outs[1]
    assert codes[0] != 0 and "all_reduce returned" not in outs[0], outs[0]
    # Rank 0 hears rank 1's first chunk, or rank 1 is gone first: either way it names it.
    assert ("rank 1 sums 12 values at 0, this rank 10" in outs[0]
            or "lost the link to worker 1" in outs[0]), outs[0]
