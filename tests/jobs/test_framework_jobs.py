"""`trainwatch snapshot PID --json` against real framework jobs: HF Trainer, plain DDP, accelerate,
Lightning, DeepSpeed, mp.spawn.

Each test starts one job of ``tests/jobs_frameworks/`` under torchrun (gloo, CPU), or under the
framework's own launcher (Lightning's, ``accelerate launch``, ``deepspeed``), waits for
the job's own log to say the fault is planted, runs the CLI as a user would (default options)
and asserts the truth: the verdict, its culprits, and where each rank is. The DDP ranks that
wait for a peer wait in DDP's gradient all_reduce *inside* ``backward``: a user must read
``collective`` there, not ``compute``.

``FRAMEWORK_JOBS_SNAPSHOT_ARGS="--native"`` adds options to every snapshot (to compare).
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shlex
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from real_jobs import FRAMEWORK_JOBS, PlantedJob, wait_quiet
from trainwatch.probes.read.processes.discover import find_job

pytestmark = [pytest.mark.job, pytest.mark.slow]

OFFLINE_ENV = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
               "WANDB_DISABLED": "true", "TOKENIZERS_PARALLELISM": "false"}
DDP_ALL_REDUCE = re.compile(r"all_?reduce")  # e.g. "all_reduce (DDP gradients)"
SETTLE_S = 1.0  # after the markers: the other ranks reach their blocking call within milliseconds


def needs(module: str):
    return pytest.mark.skipif(importlib.util.find_spec(module) is None,
                              reason=f"{module} not installed (pip install -e '.[test]')")


def line_of(script: str, marker: str) -> int:
    """1-based line of the one line of a job script that contains ``marker``."""
    lines = (FRAMEWORK_JOBS / script).read_text().splitlines()
    hits = [n for n, text in enumerate(lines, start=1) if marker in text]
    assert len(hits) == 1, f"{marker!r} in {script}: lines {hits}"
    return hits[0]


def trainwatch_cli() -> list[str]:
    script = Path(sys.executable).with_name("trainwatch")
    return [str(script)] if script.exists() else [sys.executable, "-m", "trainwatch.tui.cli"]


def snapshot(pid: int, timeout: float = 60) -> dict:
    extra = shlex.split(os.environ.get("FRAMEWORK_JOBS_SNAPSHOT_ARGS", ""))
    started = time.monotonic()
    proc = subprocess.run([*trainwatch_cli(), "snapshot", str(pid), "--json", *extra],
                          capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0 and proc.stdout.strip(), f"rc={proc.returncode}\n{proc.stderr}"
    assert "Traceback" not in proc.stderr, proc.stderr
    data = json.loads(proc.stdout)
    print(f"snapshot took {time.monotonic() - started:.1f}s\n{describe(data)}")
    return data


def describe(data: dict) -> str:
    """What trainwatch said, for the assertion messages: the verdict and each rank's place."""
    verdict = data["verdict"]
    lines = [f"verdict {verdict['kind']} culprits {verdict['culprits']}: {verdict['summary']}"]
    for r in data["ranks"]:
        lines.append(f"  rank {r['rank']} pid {r['pid']} {r['state']} phase={r['phase']} op={r['op']!r} "
                     f"where={r['where']!r} children={r['children']} detail={r['detail']!r}")
    return "\n".join(lines)


def by_rank(data: dict) -> dict[int, dict]:
    return {r["rank"]: r for r in data["ranks"]}


def assert_waits_in_ddp_gradients(rank: dict, where: str, said: str) -> None:
    """A rank blocked in DDP's gradient all_reduce inside ``backward``."""
    assert rank["state"] == "stuck", said
    assert rank["phase"] == "collective", f"rank {rank['rank']} waits in DDP's all_reduce, not compute\n{said}"
    assert rank["op"] and DDP_ALL_REDUCE.search(rank["op"]), said
    assert rank["where"] == where, said


@pytest.fixture
def framework_job(tmp_path):
    """Factory: ``framework_job("ddp_uneven.py", nproc=3)`` starts a job script under torchrun."""
    jobs: list[PlantedJob] = []

    def start(script: str, nproc: int, deadline: float = 120.0, args: list[str] | None = None,
              launcher: str = "torchrun", env: dict | None = None) -> PlantedJob:
        job = PlantedJob(tmp_path / f"job{len(jobs)}", nproc=nproc, deadline=deadline, launcher=launcher,
                         script=FRAMEWORK_JOBS / script, script_args=args, extra_env={**OFFLINE_ENV, **(env or {})})
        jobs.append(job)
        return job.start()

    yield start
    for job in jobs:
        job.stop()


@needs("transformers")
@pytest.mark.parametrize("average_tokens", [False, True], ids=["ddp-backward", "token-count-all_gather"])
def test_hf_trainer_callback_straggler(framework_job, average_tokens):
    # 3 ranks of HF Trainer (DDP, gloo): rank 2's on_step_end sleeps forever after step 2.
    # The others start step 3 and block in its first collective: DDP's gradient all_reduce
    # inside backward, or, with the Trainer's default average_tokens_across_devices=True, the
    # all_gather of the step's token count before the forward.
    job = framework_job("hf_trainer_callback.py", nproc=3, deadline=150,
                        args=["--average-tokens"] if average_tokens else [])
    # The token count is gathered before step 3's on_step_begin, so those ranks never log it.
    next_step = "step 2 ends" if average_tokens else "step 3 begins"
    job.wait_for_log(r"^\[rank 2\] planted: sleeping in on_step_end", rf"^\[rank 0\] {next_step}",
                     rf"^\[rank 1\] {next_step}", timeout=120)
    time.sleep(SETTLE_S)
    data = snapshot(job.pid)
    said = describe(data)
    verdict, ranks = data["verdict"], by_rank(data)
    assert verdict["kind"] == "straggler" and verdict["culprits"] == [2], said
    sleep_line = line_of("hf_trainer_callback.py", "planted: a user callback that never returns")
    culprit = ranks[2]
    assert culprit["state"] == "stuck" and culprit["phase"] == "sleep", said
    assert culprit["where"] == f"hf_trainer_callback.py:{sleep_line} main.<locals>.Progress.on_step_end", said
    assert "rank 2" in verdict["summary"] and "on_step_end" in verdict["summary"], said
    for waiting in (ranks[0], ranks[1]):
        if average_tokens:
            assert waiting["state"] == "stuck" and waiting["phase"] == "collective", said
            assert waiting["op"] == "all_gather", said
            assert re.fullmatch(r"trainer\.py:\d+ Trainer\._get_num_items_in_batch", waiting["where"] or ""), said
        else:
            assert waiting["state"] == "stuck" and waiting["phase"] == "collective", \
                f"rank {waiting['rank']} waits in DDP's gradient all_reduce inside backward, not compute\n{said}"
            assert waiting["op"] and DDP_ALL_REDUCE.search(waiting["op"]), said
            assert re.fullmatch(r"trainer\.py:\d+ Trainer\.training_step", waiting["where"] or ""), said
    assert {g["label"]: g["culprit"] for g in data["groups"]} == {"0-1": False, "2": True}, said
    # The Trainer's own step, from its loop's locals: rank 2 ended step 2, the others are in step 3.
    assert [ranks[n]["step"] for n in (0, 1, 2)] == [3, 3, 2], said
    assert "rank 2 is at step 2 while ranks 0-1 are at step 3" in verdict["summary"], said


def test_ddp_uneven_data_rank_leaves_the_loop(framework_job):
    # Rank 2 has one batch fewer: it waits in the end-of-epoch barrier while ranks 0-1 are in
    # step 6's backward, waiting in DDP's gradient all_reduce.
    job = framework_job("ddp_uneven.py", nproc=3)
    job.wait_for_log(r"^\[rank 2\] epoch done", r"^\[rank 0\] step 6 begins", r"^\[rank 1\] step 6 begins",
                     timeout=90)
    time.sleep(SETTLE_S)
    data = snapshot(job.pid)
    said = describe(data)
    verdict, ranks = data["verdict"], by_rank(data)
    assert verdict["kind"] == "mismatch" and verdict["culprits"] == [2], said  # both sides wait in collectives
    barrier_line = line_of("ddp_uneven.py", "dist.barrier()  # rank 2 waits here")
    backward_line = line_of("ddp_uneven.py", "loss.backward()")
    odd = ranks[2]
    assert odd["state"] == "stuck" and odd["phase"] == "collective" and odd["op"] == "barrier", said
    assert odd["where"] == f"ddp_uneven.py:{barrier_line} main", said
    assert f"ddp_uneven.py:{barrier_line}" in verdict["summary"], said
    for waiting in (ranks[0], ranks[1]):
        assert_waits_in_ddp_gradients(waiting, f"ddp_uneven.py:{backward_line} main", said)


@needs("accelerate")
@pytest.mark.parametrize("nproc", [3, 2])
def test_accelerate_metric_gathered_on_one_rank(framework_job, nproc):
    # Only rank 0 calls gather_for_metrics after step 3; the others go on to step 4 and wait
    # in DDP's gradient all_reduce inside accelerator.backward.
    job = framework_job("accelerate_gather_one_rank.py", nproc=nproc)
    others = [rf"^\[rank {r}\] step 4 begins" for r in range(1, nproc)]
    job.wait_for_log(r"^\[rank 0\] planted: gathering", *others, timeout=90)
    time.sleep(SETTLE_S)
    wait_quiet(job.rank_pids())  # every rank blocks here; under load step 4's backward may still be computing
    data = snapshot(job.pid)
    said = describe(data)
    verdict, ranks = data["verdict"], by_rank(data)
    gather_line = line_of("accelerate_gather_one_rank.py", "accelerator.gather_for_metrics(")
    backward_line = line_of("accelerate_gather_one_rank.py", "accelerator.backward(loss)")
    gather_at = f"accelerate_gather_one_rank.py:{gather_line} main"
    backward_at = f"accelerate_gather_one_rank.py:{backward_line} main"
    gathering = ranks[0]
    assert gathering["state"] == "stuck" and gathering["phase"] == "collective", said
    assert gathering["op"] in ("all_gather", "all_gather_into_tensor", "_allgather_base"), said
    assert gathering["where"] == gather_at, said
    for r in range(1, nproc):
        assert_waits_in_ddp_gradients(ranks[r], backward_at, said)
    assert verdict["kind"] == "mismatch", said
    if nproc == 3:  # ranks 1-2 are the majority: rank 0 took the odd path
        assert verdict["culprits"] == [0], said
        assert {g["label"]: g["culprit"] for g in data["groups"]} == {"0": True, "1-2": False}, said
    else:  # one rank against one: no majority, so no culprit, and both places named
        assert verdict["culprits"] == [], f"no coin toss between two ranks that disagree\n{said}"
        assert not any(g["culprit"] for g in data["groups"]), said
        assert gather_at in verdict["summary"] and backward_at in verdict["summary"], said
        assert "rank 0" in verdict["summary"] and "rank 1" in verdict["summary"], said


def test_dataloader_worker_stuck_in_ddp_loop(framework_job):
    # Rank 1's only DataLoader worker blocks in __getitem__(20); rank 1 waits for batch 6 in
    # the DataLoader while rank 0 waits in step 6's DDP gradient all_reduce.
    job = framework_job("ddp_dataloader_worker.py", nproc=2)
    text = job.wait_for_log(r"^\[rank 1\] planted: worker pid \d+ blocks", r"^\[rank 1\] step 5 ends",
                            r"^\[rank 0\] step 6 begins", timeout=90)
    worker_pid = int(re.search(r"^\[rank 1\] planted: worker pid (\d+) blocks", text, re.M).group(1))
    time.sleep(SETTLE_S)
    wait_quiet(job.rank_pids())  # under load rank 1 may still be on its way into the DataLoader's wait
    data = snapshot(job.pid)
    said = describe(data)
    verdict, ranks = data["verdict"], by_rank(data)
    assert len(data["ranks"]) == 2, said  # workers are listed under their rank, never as ranks
    assert verdict["kind"] == "straggler" and verdict["culprits"] == [1], said
    loop_line = line_of("ddp_dataloader_worker.py", "for step, (x, y) in enumerate(loader")
    backward_line = line_of("ddp_dataloader_worker.py", "loss.backward()")
    stalled = ranks[1]
    assert stalled["state"] == "stuck" and stalled["phase"] == "dataloader", said
    assert stalled["where"] == f"ddp_dataloader_worker.py:{loop_line} main", said
    assert worker_pid in stalled["children"], said
    assert_waits_in_ddp_gradients(ranks[0], f"ddp_dataloader_worker.py:{backward_line} main", said)
    # WORKER SAMPLING (in progress by the lead): the snapshot must name the stuck worker's PID
    # and its __getitem__ frame. If this fails, fix trainwatch; do not delete or weaken it.
    stuck_at = f"_jobkit.py:{line_of('_jobkit.py', 'time.sleep(max(0.0, self.stop_at')}"
    told = f"{verdict['summary']}\n{stalled['detail'] or ''}"
    assert str(worker_pid) in told and "__getitem__" in told and stuck_at in told, \
        f"WORKER SAMPLING: the stuck worker {worker_pid} and its __getitem__ frame ({stuck_at}) " \
        f"are not named in the verdict summary or rank 1's detail\n{said}"


def test_exception_with_a_lingering_thread_is_a_crash(framework_job):
    # Rank 1 raises RuntimeError("boom"); its non-daemon metrics thread keeps the process alive
    # in interpreter shutdown. Rank 0 waits in step 4's DDP gradient all_reduce.
    job = framework_job("ddp_exception_lingers.py", nproc=2)
    job.wait_for_log(r"^\[rank 1\] planted: raising", r"RuntimeError: boom", r"^\[rank 0\] step 4 begins",
                     timeout=90)
    time.sleep(SETTLE_S)
    pids = job.rank_pids()
    assert len(pids) == 2, f"rank 1 must linger for this test to mean anything: {pids}"
    data = snapshot(job.pid)
    said = describe(data)
    verdict, ranks = data["verdict"], by_rank(data)
    lingering = ranks[1]
    assert psutil.pid_exists(lingering["pid"]) and psutil.Process(lingering["pid"]).status() != psutil.STATUS_ZOMBIE, \
        f"rank 1 no longer lingers: the test proves nothing\n{said}"
    assert verdict["kind"] == "crashed" and verdict["culprits"] == [1], said
    assert "RuntimeError" in verdict["summary"] and "boom" in verdict["summary"], said
    assert lingering["phase"] == "exiting", said  # the main thread is in threading._shutdown
    backward_line = line_of("ddp_exception_lingers.py", "loss.backward()")
    assert_waits_in_ddp_gradients(ranks[0], f"ddp_exception_lingers.py:{backward_line} main", said)


def assert_lightning_job(data: dict, nproc: int, job: PlantedJob) -> None:
    """Found under Lightning's own launcher: the process started (rank 0) and the ranks it started."""
    said = describe(data)
    assert data["job"]["launcher"] == "lightning" and data["job"]["pid"] == job.pid, said
    assert data["job"]["world_size"] == nproc and sorted(by_rank(data)) == list(range(nproc)), said
    assert by_rank(data)[0]["pid"] == job.pid, said
    others = {r["pid"] for r in data["ranks"]}
    for r in data["ranks"]:  # rank 0 is the parent of the others, which are never its "children"
        assert not others & set(r["children"]), said


@needs("lightning")
def test_lightning_rank_stuck_in_a_callback(framework_job):
    # `python lightning_ddp.py`: Lightning starts rank 1 itself. Rank 1's on_train_batch_end never
    # returns after batch 3; rank 0 waits in the broadcast that begins Lightning's batch 4.
    job = framework_job("lightning_ddp.py", nproc=2, launcher="lightning",
                        args=["--devices", "2", "--fault", "callback", "--odd", "1"])
    job.wait_for_log(r"^\[rank 1\] planted: sleeping in on_train_batch_end", r"^\[rank 0\] batch 3 ends",
                     timeout=90)
    time.sleep(SETTLE_S)
    data = snapshot(job.pid)
    said = describe(data)
    verdict, ranks = data["verdict"], by_rank(data)
    assert_lightning_job(data, 2, job)
    assert verdict["kind"] == "straggler" and verdict["culprits"] == [1], said
    sleep_line = line_of("lightning_ddp.py", "planted: a user callback that never returns")
    culprit = ranks[1]
    assert culprit["state"] == "stuck" and culprit["phase"] == "sleep", said
    assert culprit["where"] == f"lightning_ddp.py:{sleep_line} main.<locals>.Progress.on_train_batch_end", said
    assert "rank 1" in verdict["summary"] and "on_train_batch_end" in verdict["summary"], said
    waiting = ranks[0]
    assert waiting["state"] == "stuck" and waiting["phase"] == "collective", said
    assert waiting["op"] == "broadcast" and "_broadcast_sigterm_tensor" in (waiting["where"] or ""), said


@needs("lightning")
def test_lightning_uneven_data(framework_job):
    # 3 ranks; rank 0 (the process started) has 3 batches, the others 6: it leaves fit and waits
    # in the barrier of trainer.save_checkpoint, while ranks 1-2 wait for its batch-4 broadcast.
    job = framework_job("lightning_ddp.py", nproc=3, launcher="lightning",
                        args=["--devices", "3", "--fault", "uneven", "--odd", "0"])
    job.wait_for_log(r"^\[rank 0\] saving the final checkpoint", r"^\[rank 1\] batch 3 ends",
                     r"^\[rank 2\] batch 3 ends", timeout=100)
    time.sleep(SETTLE_S)
    data = snapshot(job.pid)
    said = describe(data)
    verdict, ranks = data["verdict"], by_rank(data)
    assert_lightning_job(data, 3, job)
    assert verdict["kind"] == "mismatch" and verdict["culprits"] == [0], said
    odd = ranks[0]
    assert odd["state"] == "stuck" and odd["phase"] == "collective" and odd["op"] == "barrier", said
    assert re.fullmatch(r"ddp\.py:\d+ DDPStrategy\.barrier", odd["where"] or ""), said
    for waiting in (ranks[1], ranks[2]):
        assert waiting["state"] == "stuck" and waiting["phase"] == "collective", said
        assert waiting["op"] == "broadcast" and "_broadcast_sigterm_tensor" in (waiting["where"] or ""), said
    assert {g["label"]: g["culprit"] for g in data["groups"]} == {"0": True, "1-2": False}, said


@needs("lightning")
def test_lightning_dataloader_worker_never_returns(framework_job):
    # Rank 0's (the launcher-rank's) one DataLoader worker never returns item 12 (batch 4); rank 1
    # waits in batch 4's DDP gradient all_reduce. The worker is rank 0's child; rank 1 is not.
    job = framework_job("lightning_ddp.py", nproc=2, launcher="lightning",
                        args=["--devices", "2", "--fault", "worker", "--odd", "0"])
    text = job.wait_for_log(r"^\[rank 0\] planted: worker pid \d+ blocks", r"^\[rank 1\] batch 4 begins",
                            timeout=90)
    worker_pid = int(re.search(r"^\[rank 0\] planted: worker pid (\d+) blocks", text, re.M).group(1))
    time.sleep(SETTLE_S)
    data = snapshot(job.pid)
    said = describe(data)
    verdict, ranks = data["verdict"], by_rank(data)
    assert_lightning_job(data, 2, job)
    assert verdict["kind"] == "straggler" and verdict["culprits"] == [0], said
    stalled = ranks[0]
    assert stalled["state"] == "stuck" and stalled["phase"] == "dataloader", said
    assert stalled["children"] == [worker_pid], said
    stuck_at = f"_jobkit.py:{line_of('_jobkit.py', 'time.sleep(max(0.0, self.stop_at')}"
    assert str(worker_pid) in stalled["detail"] and f"{stuck_at} StallingItems.__getitem__" in stalled["detail"], said
    waiting = ranks[1]
    assert waiting["state"] == "stuck" and waiting["phase"] == "collective", said
    assert waiting["op"] and DDP_ALL_REDUCE.search(waiting["op"]), said
    assert re.fullmatch(r"module\.py:\d+ LightningModule\.backward", waiting["where"] or ""), said
    # From rank 1 (started by Lightning) and from rank 0's worker, the same job and ranks.
    for pid in (waiting["pid"], worker_pid):
        found = find_job(pid)
        assert (found.launcher, found.root_pid) == ("lightning", job.pid), found
        assert [(r.rank, r.pid) for r in found.ranks] == [(0, job.pid), (1, waiting["pid"])], found


def assert_found_under(data: dict, launcher: str, job: PlantedJob, nproc: int) -> None:
    """The job seen from its launcher's PID: that launcher, and every rank beneath it."""
    said = describe(data)
    assert data["job"]["launcher"] == launcher and data["job"]["pid"] == job.pid, said
    assert data["job"]["world_size"] == nproc and sorted(by_rank(data)) == list(range(nproc)), said
    assert job.pid not in {r["pid"] for r in data["ranks"]}, f"the launcher is not a rank\n{said}"


def assert_sleeping_straggler(data: dict, culprit: int, at: str, function: str) -> None:
    said = describe(data)
    verdict, ranks = data["verdict"], by_rank(data)
    assert verdict["kind"] == "straggler" and verdict["culprits"] == [culprit], said
    sleeping = ranks[culprit]
    assert sleeping["state"] == "stuck" and sleeping["phase"] == "sleep", said
    assert sleeping["where"] == at, said
    assert f"rank {culprit}" in verdict["summary"] and function in verdict["summary"], said


@needs("accelerate")
def test_accelerate_launch_straggler(framework_job):
    # `accelerate launch --multi_gpu --num_processes 2` with no GPU: its MULTI_CPU mode (gloo).
    # Rank 1 sleeps in upload_checkpoint after step 3; rank 0 waits in step 4's DDP all_reduce.
    script = "accelerate_launch_straggler.py"
    job = framework_job(script, nproc=2, launcher="accelerate")
    job.wait_for_log(r"^\[rank 0\] accelerate starts: DistributedType\.MULTI_CPU backend gloo world 2",
                     r"^\[rank 1\] planted: sleeping in upload_checkpoint", r"^\[rank 0\] step 4 begins",
                     timeout=90)
    time.sleep(SETTLE_S)
    data = snapshot(job.pid)
    assert_found_under(data, "accelerate", job, 2)
    sleep_line = line_of(script, "planted: an upload that never returns")
    assert_sleeping_straggler(data, 1, f"{script}:{sleep_line} upload_checkpoint", "upload_checkpoint")
    backward_line = line_of(script, "accelerator.backward(loss)")
    assert_waits_in_ddp_gradients(by_rank(data)[0], f"{script}:{backward_line} main", describe(data))


@pytest.mark.skipif(importlib.util.find_spec("deepspeed") is None,
                    reason="deepspeed not installed: its sdist builds against the installed torch "
                           "(pip install --no-build-isolation -r tests/requirements-deepspeed.txt)")
def test_deepspeed_zero2_straggler(framework_job):
    # `deepspeed --num_gpus 2 …` on CPU (DS_ACCELERATOR=cpu: gloo); ZeRO stage 2. Rank 1 sleeps in
    # read_next_shard after step 3; rank 0 waits in ZeRO's gradient all_reduce in step 4's backward.
    script = "deepspeed_zero_straggler.py"
    job = framework_job(script, nproc=2, launcher="deepspeed", env={"DS_ACCELERATOR": "cpu", "DS_BUILD_OPS": "0"})
    job.wait_for_log(r"^\[rank 1\] planted: sleeping in read_next_shard", r"^\[rank 0\] step 4 begins", timeout=100)
    time.sleep(SETTLE_S)
    data = snapshot(job.pid)
    said = describe(data)
    assert_found_under(data, "deepspeed", job, 2)
    sleep_line = line_of(script, "planted: a shard read that never returns")
    assert_sleeping_straggler(data, 1, f"{script}:{sleep_line} read_next_shard", "read_next_shard")
    waiting = by_rank(data)[0]
    assert waiting["state"] == "stuck" and waiting["phase"] == "collective" and waiting["op"] == "all_reduce", said
    assert re.fullmatch(r"stage_1_and_2\.py:\d+ DeepSpeedZeroOptimizer\.\w+", waiting["where"] or ""), said
    assert [by_rank(data)[n]["step"] for n in (0, 1)] == [4, 3], said
    # From the per-node launcher and from a rank, the same job: the outermost launcher.
    node_launcher = next(p.pid for p in psutil.Process(job.pid).children(recursive=True)
                         if "deepspeed.launcher.launch" in p.cmdline())
    for pid in (node_launcher, waiting["pid"]):
        found = find_job(pid)
        assert (found.launcher, found.root_pid, len(found.ranks)) == ("deepspeed", job.pid, 2), found


def test_mp_spawn_crash_reason_from_the_parents_report(framework_job, tmp_path):
    # mp.spawn: rank 1 raises; the child prints nothing, the parent prints its traceback without a
    # rank prefix as it exits. `trainwatch watch` still names rank 1, its exception and its line.
    script = "spawn_rank_raises.py"
    job = framework_job(script, nproc=2, launcher="python")
    job.wait_for_log(r"^\[rank 0\] step 3$", r"^\[rank 1\] step 3$", timeout=60)
    out = tmp_path / "watch"
    watch = subprocess.Popen([*trainwatch_cli(), "watch", str(job.pid), "--out", str(out), "--interval", "1"],
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        seen = []
        for line in watch.stdout:  # its first verdict: the watcher has found the ranks
            seen.append(line)
            if " verdict " in line:
                break
        assert seen and " verdict " in seen[-1], "".join(seen)
        (job.workdir / "raise-now").touch()
        rest, _ = watch.communicate(timeout=60)
    finally:
        if watch.poll() is None:
            watch.kill()
            watch.wait()
    said = "".join(seen) + rest
    job.proc.wait(timeout=30)  # the parent may still be writing the traceback when watch has seen the death
    log = job.log.read_text(errors="replace")
    assert "-- Process 1 terminated with the following error:" in log and "[rank1]" not in log, log
    raise_line = line_of(script, "planted: rank 1 raises")
    told = [line for line in said.splitlines() if re.search(r" crash (reason )?rank 1 ", line)]
    assert told, said
    crash = told[-1]  # at the death, or a moment later once the parent has printed the traceback
    assert "RuntimeError: boom" in crash and f"{script}:{raise_line} worker" in crash, said
    assert "(first to die)" in crash, said
    assert watch.returncode == 11, said
    records = [json.loads(p.read_text()) for p in (out / "crashes").glob("rank1-pid*.json")]
    assert len(records) == 1, said
    assert records[0]["exit"]["reason"] == "RuntimeError" and records[0]["exit"]["message"] == "RuntimeError: boom"
    assert records[0]["exit"]["frame"].endswith(f"{script}:{raise_line} worker"), records[0]


@pytest.mark.parametrize("script, launcher, args", [
    pytest.param("lightning_ddp.py", "lightning", ["--devices", "2", "--fault", "callback", "--odd", "1"],
                 marks=needs("lightning"), id="lightning"),
    pytest.param("spawn_rank_raises.py", "python", [], id="mp.spawn"),
])
def test_trainwatch_run_arms_ranks_that_have_no_RANK_at_start(tmp_path, script, launcher, args):
    """Lightning's launcher and mp.spawn start ranks with no RANK in their environment: each is armed
    when it joins its process group (and the process that started them only then, if it is a rank)."""
    run_dir = tmp_path / "run"
    prefix = [sys.executable, "-m", "trainwatch.tui.cli", "run", "--out", str(run_dir), "--"]
    with PlantedJob(tmp_path / "job", nproc=2, deadline=60, launcher=launcher, script=FRAMEWORK_JOBS / script,
                    script_args=args, extra_env=OFFLINE_ENV, prefix=prefix) as job:
        job.wait_for_log(r"^\[rank 0\] (batch|step) 3", r"^\[rank 1\] (batch|step) 3", timeout=90)
        hooks = {rank: json.loads((run_dir / "ranks" / str(rank) / "hook.json").read_text()) for rank in (0, 1)}
        ranks = {p.pid: p for p in find_job(job.pid).ranks}
        for rank, hook in hooks.items():
            assert hook["pid"] in ranks and ranks[hook["pid"]].rank == rank, (hook, ranks)
            assert psutil.pid_exists(hook["pid"])
        assert not (run_dir / "ranks" / "2").exists()  # nothing else armed (no launcher, no worker)
        data = snapshot(job.pid)
    assert {r["rank"]: r["pid"] for r in data["ranks"]} == {rank: hook["pid"] for rank, hook in hooks.items()}, \
        describe(data)
    if launcher == "python":  # mp.spawn: the rank numbers come from the hook, no longer from start order
        notes = json.dumps(data.get("notes")) + json.dumps(data["job"])
        assert "rank numbers from trainwatch's hook" in notes and "inferred from start order" not in notes, notes
