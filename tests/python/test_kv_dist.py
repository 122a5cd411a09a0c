"""troupe.kv across processes: the same program on 2 workers and 1 parameter server, started by
`troupe launch` (tests/python/kv_worker.py)."""
import os
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))


def launch(args, store):
    cmd = [os.environ.get("TROUPE", "troupe"), "launch", *args, "--", sys.executable,
           os.path.join(HERE, "kv_worker.py"), store]
    return subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          timeout=240)


@pytest.mark.parametrize("store,args", [("dist_sync", ["-n", "2", "-s", "1"]),
                                        ("ring", ["-n", "2"])])
def test_two_workers_see_every_step_of_the_summed_pushes(store, args):
    r = launch(args, store)
    assert r.returncode == 0, r.stdout
    # Step s's value: 1 - 0.5 * 3 * (s + 1), exact in float32; dist_sync's pull after a push
    # waits for that step's update, and so does the ring's.
    for rank in (0, 1):
        for step, value in enumerate((-0.5, -2, -3.5)):
            line = f"[worker {rank}] worker {rank} of 2 step {step}: {value:g}"
            assert line in r.stdout, r.stdout
        if store != "ring":
            refused = (f"[worker {rank}] worker {rank}: input: save_optimizer_states: a {store} "
                       "store's optimizer states are not kept here")
            assert refused in r.stdout, r.stdout


def test_dist_async_applies_each_push_as_it_comes():
    r = launch(["-n", "2", "-s", "1"], "dist_async")
    assert r.returncode == 0, r.stdout
    # Each push is applied as it comes, at the learning rate as set: worker 0's pushes take 0.5
    # each, worker 1's 1. A worker's pull after its 3rd push holds its own 3 pushes and 0 to 3 of
    # the other's: worker 0 sees 1 - 1.5 - [0, 3], worker 1 sees 1 - 3 - [0, 1.5].
    for rank, (low, high) in ((0, (-3.5, -0.5)), (1, (-3.5, -2.0))):
        final = [line for line in r.stdout.splitlines()
                 if line.startswith(f"[worker {rank}] ") and " step 2: " in line]
        assert len(final) == 1, r.stdout
        assert low <= float(final[0].rsplit(" ", 1)[1]) <= high, r.stdout


def test_processes_placed_by_mxnets_dmlc_variables():
    # As MXNet's tools/launch.py places them (less its scheduler: worker 0 serves the rendezvous
    # at DMLC_PS_ROOT_URI:DMLC_PS_ROOT_PORT), each process started by hand.
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = dict(os.environ, DMLC_PS_ROOT_URI="127.0.0.1", DMLC_PS_ROOT_PORT=str(port),
               DMLC_NUM_WORKER="2", DMLC_NUM_SERVER="1")
    for name in [k for k in env if k.startswith("TROUPE_")]:
        del env[name]
    roles = [("server", {"DMLC_SERVER_ID": "0"}), ("worker", {"DMLC_WORKER_ID": "0"}),
             ("worker", {"DMLC_WORKER_ID": "1"})]
    procs = [subprocess.Popen([sys.executable, os.path.join(HERE, "kv_worker.py"), "dist_sync"],
                              env=dict(env, DMLC_ROLE=role, **ids), stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True) for role, ids in roles]
    outputs = []
    try:
        for p in procs:
            outputs.append(p.communicate(timeout=120)[0])
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    for p, out in zip(procs, outputs):
        assert p.returncode == 0, out
    for rank in (0, 1):
        assert f"worker {rank} of 2 step 2: -3.5" in outputs[1 + rank], outputs[1 + rank]


def test_a_ring_workers_optimizer_states_save_and_load_as_a_local_stores(tmp_path):
    r = subprocess.run([os.environ.get("TROUPE", "troupe"), "launch", "-n", "2", "--",
                        sys.executable, os.path.join(HERE, "kv_states_worker.py"), str(tmp_path)],
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=240)
    assert r.returncode == 0, r.stdout
    for rank in (0, 1):
        assert (f"[worker {rank}] worker {rank}: the ring's states saved and loaded as the local "
                "store's") in r.stdout, r.stdout


def test_a_process_that_never_comes_ends_create_with_a_timeout_naming_the_missing_ones():
    # Worker 0 of 2 workers and 1 server, alone: it serves the rendezvous (DMLC_PS_ROOT_URI) and
    # waits rendezvous_timeout for the others, then says whom it waited for.
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {k: v for k, v in os.environ.items() if not k.startswith("TROUPE_")}
    env.update(DMLC_PS_ROOT_URI="127.0.0.1", DMLC_PS_ROOT_PORT=str(port), DMLC_NUM_WORKER="2",
               DMLC_NUM_SERVER="1", DMLC_ROLE="worker", DMLC_WORKER_ID="0")
    script = ("import troupe\n"
              "try:\n"
              "    troupe.kv.create('dist_sync', settings={'rendezvous_timeout': 2})\n"
              "except troupe.Error as e:\n"
              "    print('kind', e.kind, '|', e)\n")
    r = subprocess.run([sys.executable, "-c", script], env=env, stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, text=True, timeout=60)
    assert r.returncode == 0, r.stdout
    assert "kind timeout | " in r.stdout, r.stdout
    assert "timed out after 2 s waiting for worker 1, server 0 (ranks 1, 2 of 3)" in r.stdout, \
        r.stdout
