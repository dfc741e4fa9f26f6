"""The job that never formed, judged on hand-built ranks: ranks waiting in init for a rank that is
elsewhere, and a launcher waiting for nodes that never joined its store."""

from __future__ import annotations

from trainwatch.probes.judge.phases import classify
from trainwatch.probes.judge.verdict import judge
from trainwatch.probes.snapshot import Frame, Job, KernelState, Rank, Rendezvous, ThreadStack

SITE = "/venv/lib/python3.11/site-packages"
C10D = f"{SITE}/torch/distributed/distributed_c10d.py"
JOB = Job(launcher="torchrun", pid=1, host="h", world_size=3)


def main(*frames: tuple[str, str, int]) -> tuple[ThreadStack, ...]:
    return (ThreadStack("MainThread", tid=1, is_main=True, active=False,
                        frames=tuple(Frame(fn, path, line) for fn, path, line in frames)),)


IN_INIT = main(("_new_process_group_helper", C10D, 2000), ("init_process_group", C10D, 1700),
               ("wrapper", f"{SITE}/torch/distributed/c10d_logger.py", 83), ("main", "/w/train.py", 39))
IN_NEW_GROUP = main(("_new_process_group_helper", C10D, 2000), ("new_group", C10D, 5000),
                    ("main", "/w/train.py", 60))


def waiting(n: int, threads: tuple[ThreadStack, ...] = IN_INIT) -> Rank:
    return Rank(n, pid=100 + n, state="stuck", phase="init", op="_new_process_group_helper",
                where="train.py:39 main", stuck_for_s=40.0, threads=threads)


LATE = Rank(2, pid=102, state="stuck", phase="unknown", where="train.py:22 load_config", stuck_for_s=40.0,
            kernel=KernelState(letter="S", syscall="recvfrom", target="tcp 127.0.0.1:41000 -> 10.0.0.9:443"))


def test_the_rank_not_in_init_never_joined():
    v = judge([waiting(0), waiting(1), LATE], JOB)
    assert (v.kind, v.culprits) == ("rendezvous", (2,)), v
    assert v.summary == ("rank 2 never joined: it is at train.py:22 load_config (in recv() on "
                         "tcp 127.0.0.1:41000 -> 10.0.0.9:443, 40 s); ranks 0-1 wait in init_process_group "
                         "at train.py:39 main")


def test_a_busy_rank_or_an_unreadable_one_is_named_too():
    busy = Rank(2, pid=102, state="running", phase="compute", where="data.py:9 download")
    v = judge([waiting(0), waiting(1), busy], JOB)
    assert (v.kind, v.culprits) == ("rendezvous", (2,)) and "it is at data.py:9 download (running)" in v.summary
    unread = Rank(2, pid=102, state="unknown")
    v = judge([waiting(0), waiting(1), unread], JOB)
    assert (v.kind, v.culprits) == ("rendezvous", (2,)) and "could not be read" in v.summary


def test_ranks_still_moving_through_init_or_one_past_it_are_not_a_job_that_never_formed():
    moving = Rank(1, pid=101, state="running", phase="init", op="_new_process_group_helper", threads=IN_INIT)
    assert judge([waiting(0), moving, LATE], JOB).kind != "rendezvous"
    in_collective = Rank(2, pid=102, state="stuck", phase="collective", op="all_reduce", where="train.py:70 step")
    v = judge([waiting(0, IN_NEW_GROUP), waiting(1, IN_NEW_GROUP), in_collective], JOB)
    assert v.kind != "rendezvous", v  # a subgroup some rank skipped: the collectives disagree


def test_a_subgroup_not_reached_in_a_job_that_formed_has_a_straggler():
    v = judge([waiting(0, IN_NEW_GROUP), waiting(1, IN_NEW_GROUP), LATE], JOB)
    assert (v.kind, v.culprits) == ("straggler", (2,)) and v.summary.startswith("rank 2 has not reached new_group")


def test_a_launcher_names_the_nodes_its_store_waits_for():
    def waits(rdzv: Rendezvous | None):
        return judge([], Job(launcher="torchrun", pid=7, host="h", nnodes=3, waiting_rendezvous=True, rendezvous=rdzv))

    v = waits(Rendezvous(store="127.0.0.1:29500", served_here=True, host_pid=7, nodes_joined=1,
                         missing_nodes=(1, 2), missing_ranks=(2, 3, 4, 5)))
    assert (v.kind, v.culprits) == ("rendezvous", (2, 3, 4, 5))
    assert "node 1, node 2 (ranks 2-5) have not connected to its store at 127.0.0.1:29500 (1 of 3 nodes joined)" \
        in v.summary
    v = waits(Rendezvous(store="127.0.0.1:29500", served_here=True, host_pid=7, nodes_joined=2))
    assert v.culprits == () and "1 of 3 nodes has not connected to its store at 127.0.0.1:29500 (2 joined)" in v.summary
    v = waits(Rendezvous(store="10.0.0.1:29500", served_here=False))
    assert "other nodes have not joined (its store at 10.0.0.1:29500 is served on another node)" in v.summary
    assert "other nodes have not joined" in waits(None).summary


def test_a_synchronous_ray_actor_trains_on_its_main_thread():
    """Ray runs a synchronous actor's method on the main thread, under its worker loop: that thread
    is the one judged (Ray Train's main thread, with none of the user's frames, only waits)."""
    ray = f"{SITE}/ray/_private/worker.py"
    actor = main(("all_reduce", C10D, 2800), ("run_steps", "/w/job.py", 38), ("train", "/w/job.py", 67),
                 ("main_loop", ray, 1069))
    deadline = ThreadStack("deadline", tid=2, frames=(Frame("_expire", "/w/job.py", 39),))
    assert classify(actor + (deadline,)).where == "job.py:38 run_steps"
    train_main = main(("get_next", f"{SITE}/ray/train/_internal/session.py", 400), ("main_loop", ray, 1069))
    training = ThreadStack("TrainingThread(train_func)", tid=3, frames=(Frame("loop", "/w/job.py", 10),))
    assert classify(train_main + (training,)).where == "job.py:10 loop"


def test_ranks_never_connected_to_a_store_are_named_together():
    job = Job(launcher="ray actors", pid=1, host="h", world_size=4,
              rendezvous=Rendezvous(store="10.0.0.1:4000", served_here=True, numbered_by="their locals"))
    missing = [Rank(n, state="missing") for n in (1, 3)]
    v = judge([waiting(0), waiting(2), *missing], job)
    assert (v.kind, v.culprits) == ("rendezvous", (1, 3)), v
    assert v.summary == ("ranks 1,3 never joined: no process is connected to the store at 10.0.0.1:4000 as ranks 1,3; "
                         "ranks 0,2 wait in init_process_group at train.py:39 main")
