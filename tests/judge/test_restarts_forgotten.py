"""A week-long view of a job whose ranks restart: what is remembered per PID does not grow with them."""

from __future__ import annotations

import time

from trainwatch.probes.judge.judgement import JudgeMemory, JudgeOptions, judge_job
from trainwatch.probes.observed import ObservedJob
from trainwatch.probes.local_evidence import LocalEvidence
from trainwatch.probes.read.processes.exits import ExitLedger
from trainwatch.probes.read.processes.process import JobProcesses, RankProcess, job_record
from trainwatch.probes.sampling import Sampler
from trainwatch.probes.snapshot import Frame, ThreadStack

BASE = 4_000_000  # PIDs above pid_max: never a real process here
STACK = (ThreadStack("MainThread", frames=(Frame("all_reduce", "/job/c10d.py", 9),), is_main=True),)


def test_hundreds_of_restarts_leave_the_memory_flat():
    memory = JudgeMemory()
    exits = ExitLedger(root_pid=1)
    sampler = Sampler(exits)
    evidence = LocalEvidence(sampler, exits, gpu=None)
    sizes = []
    started = time.monotonic()
    for restart in range(400):
        pids = (BASE + 2 * restart, BASE + 2 * restart + 1)  # both ranks restart every poll
        job = JobProcesses(launcher="torchrun", root_pid=1, host="h", local_world_size=2, world_size=2,
                           ranks=tuple(RankProcess(pid=p, rank=n, local_rank=n, create_time=float(restart))
                                       for n, p in enumerate(pids)))
        for pid in pids:  # what a sampling round leaves behind
            sampler.stacks[pid] = STACK
            sampler.watch.observe(pid, ("sig",), "collective", None, None, float(restart), dumped=True)
        notes: list[str] = []
        ranks, _ = evidence.ranks(job, {}, float(restart), [], notes)
        judge_job(ObservedJob(job_record(job), tuple(ranks)), memory, float(restart), JudgeOptions(window=1.0))
        assert sorted(r.rank for r in ranks if r.seen != "exited") == [0, 1]
        if restart:  # the restart is still said
            assert any(f"rank 0 restarted: PID {pids[0] - 2} -> {pids[0]}" in n for n in notes), notes
        sizes.append((len(evidence.seen), len(sampler.stacks), len(sampler.watch._looks), len(memory.progress._tracks),
                      len(exits._exits)))
    took = time.monotonic() - started
    print(f"\n[restarts] 400 polls of 2 restarting ranks in {took:.2f} s; remembered (seen, stacks, "
          f"the sampler's looks, the judge's progress, exits) after 10: {sizes[9]}, after 400: {sizes[-1]}")
    assert sizes[-1] == sizes[9] and max(sizes[-1]) <= 4
