"""`trainwatch dump` on real gloo jobs: armed and unarmed, secrets, dying ranks, full disks, `open`."""

from __future__ import annotations

import base64
import gzip
import os
import signal
import subprocess
import sys
import tarfile
import threading
import time
from pathlib import Path

import psutil
import pytest

from real_jobs import PLANTED, PlantedJob, rank_stuck_at, wait_until
from trainwatch.probes.errors import BadBundle, OutputError
from trainwatch.probes.evidence.bundle import write_bundle
from trainwatch.probes.evidence.bundle_rank import FAULTHANDLER_NOT_ARMED, RankEvidence, RankPlan, _faulthandler
from trainwatch.probes.evidence.bundle_source import BundleSource
from trainwatch.probes.read.processes import procfs
from trainwatch.tui.cli import main as cli

pytestmark = [pytest.mark.job, pytest.mark.slow]

CANARIES = {
    "WANDB_API_KEY": "wandb-canary-9f8e7d6c5b",
    "HF_TOKEN": "hf_canaryTOKEN_1234567",
    "AWS_SECRET_ACCESS_KEY": "aws-canary-secret-abcdef",
    "HTTPS_PROXY": "http://user:hunter2pass@proxy:3128",
}
CMDLINE_CANARY = "cmdline-canary-token-42"
CANARY_VALUES = [*CANARIES.values()][:3] + ["hunter2pass", CMDLINE_CANARY]


def _run_prefix(out: Path) -> list[str]:
    return [sys.executable, "-m", "trainwatch.tui.cli", "run", "--out", str(out), "--"]


def _stop(job: PlantedJob) -> None:
    """Kill the job and every process under it (`trainwatch run` puts the job in its own session)."""
    try:
        below = psutil.Process(job.pid).children(recursive=True)
    except psutil.Error:
        below = []
    job.stop()
    for proc in below:
        try:
            proc.kill()
        except psutil.Error:
            pass
    psutil.wait_procs(below, timeout=10)


def _ranks(job: PlantedJob) -> list[int]:
    """Rank PIDs: the processes running the training script, not launchers nor workers."""
    found = []
    for child in psutil.Process(job.pid).children(recursive=True):
        try:
            cmd, parent = child.cmdline(), child.parent().cmdline()
        except psutil.Error:
            continue
        if "--scenario" in cmd and not any("torch.distributed.run" in a or "trainwatch" in a for a in cmd) \
                and "--scenario" in " ".join(parent) and "torch.distributed.run" in " ".join(parent):
            found.append(child.pid)
    return sorted(found)


def _start(tmp: Path, scenario: str, nproc: int = 2, armed: bool = False, **kwargs) -> PlantedJob:
    job = PlantedJob(tmp / f"job-{scenario}", scenario, nproc=nproc, deadline=90,
                     prefix=_run_prefix(tmp / "run") if armed else None, **kwargs)
    return job.start()


STRAGGLER = ("# stuck in its own work",)  # the culprit's planted sleep
MISMATCH = ("dist.all_gather(gathered", "dist.all_reduce(param.grad)")  # the culprit's and the others' collective


def _wait(job: PlantedJob, nproc: int, planted: tuple[str, ...] = ()) -> list[int]:
    """The ranks' PIDs once every rank started and, for each of ``planted`` (lines of
    tui/planted.py), a rank is stuck on it: the planted fault is in place."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        text = job.log.read_text(errors="replace") if job.log.exists() else ""
        pids = _ranks(job)
        if text.count("scenario ") >= nproc and len(pids) == nproc:
            break
        assert job.alive(), text[-3000:]
        time.sleep(0.2)
    else:
        raise TimeoutError(job.log.read_text(errors="replace")[-3000:])
    for line in planted:
        wait_until(lambda: rank_stuck_at(job.script, line, code=PLANTED), 60, f"a rank stuck on {line!r}")
    return pids


def _snapshot(pid: int):
    from trainwatch.probes.live import open_source
    source = open_source(pid, window=0.5)
    try:
        return source.poll()
    finally:
        source.close()


def _all_bytes(path: Path) -> bytes:
    """Every byte of a bundle (directory or tarball, decompressed), for grepping."""
    if path.is_dir():
        return b"\n".join(p.read_bytes() for p in sorted(path.rglob("*")) if p.is_file())
    with tarfile.open(path, "r:gz") as tar:
        blobs = [tar.extractfile(m).read() for m in tar.getmembers() if m.isfile()]
    return gzip.decompress(path.read_bytes()) + b"\n".join(blobs)


# ---- armed jobs (through `trainwatch run` and the hook)

@pytest.fixture(scope="module")
def armed_mismatch(tmp_path_factory):
    """An armed 3-rank mismatch, read (never changed) by the tests below: its rank PIDs."""
    job = _start(tmp_path_factory.mktemp("armed"), "mismatch", nproc=3, armed=True)
    try:
        yield _wait(job, 3, MISMATCH)
    finally:
        _stop(job)


def test_mismatch_bundle_has_every_flight_recorder_trace_and_names_the_culprit(armed_mismatch, tmp_path):
    pids = armed_mismatch
    out = subprocess.run([sys.executable, "-m", "trainwatch.tui.cli", "dump", str(pids[0]), "--out",
                          str(tmp_path / "out"), "--no-native", "--window", "0.5"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    bundle = Path(out.stdout.strip().splitlines()[-1])
    assert bundle.is_dir() and bundle.parent == tmp_path / "out"
    for rank in range(3):
        assert list((bundle / "ranks" / str(rank) / "flight-recorder").glob("*.json")), rank
    summary = (bundle / "summary.md").read_text()
    assert "rank 2 enqueued all_gather #" in summary and "ranks 0-1 enqueued all_reduce #" in summary
    assert "Culprit rank(s) by collectives: 2" in summary
    assert BundleSource(bundle).poll().collectives.culprits == (2,)


def test_bundle_verdict_is_judged_again_with_its_collective_state(armed_mismatch, tmp_path):
    """The verdict handed to the bundle came from stacks alone and blamed the wrong ranks (as a
    real bundle once did: "straggler, culprits 0-1" over a Collective state section naming rank 2).
    The bundle judges again with the Flight Recorder traces it collected: one story throughout."""
    import dataclasses
    import json as _json
    from trainwatch.probes.snapshot import Verdict

    pids = armed_mismatch
    sampled = _snapshot(pids[0])
    wrong = Verdict("straggler", (0, 1), "ranks 0-1 are in compute while rank 2 waits in all_gather")
    given = dataclasses.replace(sampled, verdict=wrong, collectives=None)
    bundle = write_bundle(pids[0], given, tmp_path / "out", native=False)
    summary = (bundle / "summary.md").read_text()
    verdict_section = summary.split("## Verdict")[1].split("## Collective state")[0]
    collective_section = summary.split("## Collective state")[1].split("## Stack groups")[0]
    assert "rank 2 enqueued all_gather #" in collective_section
    assert "Culprit rank(s) by collectives: 2" in collective_section
    assert "**mismatch**: rank 2 enqueued all_gather #" in verdict_section, verdict_section
    assert "Culprit rank(s): 2\n" in verdict_section and "straggler" not in verdict_section
    data = _json.loads((bundle / "snapshot.json").read_text())
    assert (data["verdict"]["kind"], data["verdict"]["culprits"]) == ("mismatch", [2])
    assert [g["ranks"] for g in data["groups"] if g["culprit"]] == [[2]]
    reopened = BundleSource(bundle).poll()
    assert reopened.verdict.culprits == reopened.collectives.culprits == (2,)


def test_straggler_bundle_has_faulthandler_traces_of_all_threads(tmp_path):
    job = _start(tmp_path, "straggler", nproc=2, armed=True)
    try:
        pids = _wait(job, 2, STRAGGLER)
        bundle = write_bundle(pids[0], _snapshot(pids[0]), tmp_path / "out", native=False)
        for rank in (0, 1):
            text = (bundle / "ranks" / str(rank) / "faulthandler.txt").read_text()
            assert text.count("Thread 0x") + text.count("Current thread") >= 2, text
            assert "train" in text
        assert all(psutil.pid_exists(p) for p in pids)  # the traces did not hurt the ranks
        assert "faulthandler, every rank: collected" in (bundle / "summary.md").read_text()
    finally:
        _stop(job)


# ---- unarmed jobs

@pytest.fixture(scope="module")
def canary_job(tmp_path_factory):
    """An unarmed straggler with planted secrets in its environment and on its command line."""
    tmp = tmp_path_factory.mktemp("canary")
    job = PlantedJob(tmp / "job", "straggler", nproc=2, deadline=120,
                     extra_env={**CANARIES, "NCCL_DEBUG": "WARN", "TOKENIZERS_PARALLELISM": "false"})
    # The planted script does not know --token: strip it before handing over.
    job.script.write_text("import sys\nargs = sys.argv[1:]\ni = args.index('--token')\ndel args[i:i + 2]\n"
                          "from trainwatch.tui.planted import main\nsys.exit(main(args))\n")
    job.cmd += ["--token", CMDLINE_CANARY]
    job.start()
    try:
        pids = _wait(job, 2, STRAGGLER)
        yield job, pids, tmp
    finally:
        _stop(job)


def test_unarmed_bundle_says_what_was_missing_and_sends_no_signal(canary_job):
    job, pids, tmp = canary_job
    caught = {pid: procfs.caught_signals(pid) for pid in pids}
    bundle = write_bundle(pids[0], _snapshot(pids[0]), tmp / "out-unarmed", native=False)
    summary = (bundle / "summary.md").read_text()
    assert FAULTHANDLER_NOT_ARMED in summary
    assert "no Flight Recorder trace obtainable" in summary
    assert "No collective state" in summary
    assert not list(bundle.glob("ranks/*/faulthandler.txt"))
    assert job.alive() and all(psutil.pid_exists(p) for p in pids)
    assert {pid: procfs.caught_signals(pid) for pid in pids} == caught
    for rank in (0, 1):
        for name in ("stacks.txt", "proc.txt", "fds.txt", "env.txt", "nccl-settings.txt", "notes.txt"):
            assert (bundle / "ranks" / str(rank) / name).is_file(), name
    assert oct((bundle / "ranks").stat().st_mode & 0o777) == "0o700"
    assert oct((bundle / "summary.md").stat().st_mode & 0o777) == "0o600"


def test_user_signal_is_not_sent_when_the_rank_does_not_catch_it():
    """--signal SIGUSR1 on a process without a handler: SIGUSR1 would kill it, so alive = not sent."""
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"], stderr=subprocess.DEVNULL)
    try:
        time.sleep(0.5)
        ev = RankEvidence(rank=0, pid=proc.pid)
        _faulthandler(RankPlan(pid=proc.pid, rank=0, host="h", fault_signal=int(signal.SIGUSR1)), ev)
        assert proc.poll() is None
        assert ev.faulthandler.startswith("not sent")
    finally:
        proc.kill()
        proc.wait()


@pytest.mark.parametrize("tar", [False, True])
def test_canary_secrets_are_absent_from_the_whole_bundle(canary_job, tar):
    job, pids, tmp = canary_job
    bundle = write_bundle(pids[0], _snapshot(pids[0]), tmp / f"out-canary-{tar}", native=False, tar=tar)
    data = _all_bytes(bundle)
    for value in CANARY_VALUES:
        for form in (value.encode(), base64.b64encode(value.encode()), base64.b64encode(value.encode()).rstrip(b"=")):
            assert form not in data, value
    assert b"NCCL_DEBUG=WARN" in data and b"TOKENIZERS_PARALLELISM=false" in data
    assert b"HF_TOKEN=<redacted>" in data and b"--token <redacted>" in data


def test_no_redact_says_so_loudly(canary_job):
    job, pids, tmp = canary_job
    bundle = write_bundle(pids[0], _snapshot(pids[0]), tmp / "out-raw", native=False, redact=False)
    assert CANARIES["HF_TOKEN"] in (bundle / "ranks" / "0" / "env.txt").read_text()
    assert "NOT REDACTED" in (bundle / "summary.md").read_text()


@pytest.mark.parametrize("options", ["size=64k", "ro"])
def test_full_disk_or_read_only_target(canary_job, tmp_path, options):
    job, pids, _ = canary_job
    target = tmp_path / "mnt"
    target.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(target)],
                      capture_output=True).returncode != 0:
        pytest.skip("cannot mount a tmpfs here")
    try:
        with pytest.raises(OutputError):
            write_bundle(pids[0], _snapshot(pids[0]), target, native=False, tar=(options != "ro"))
        assert list(target.iterdir()) == []  # no bundle, no partial, no temp
        assert job.alive() and all(psutil.pid_exists(p) for p in pids)
    finally:
        subprocess.run(["umount", str(target)], check=False)


# ---- a rank that exits during the dump

def test_rank_exiting_during_the_dump(tmp_path):
    job = _start(tmp_path, "healthy", nproc=2, step_s=0.2)
    try:
        pids = _wait(job, 2)
        snapshot = _snapshot(pids[0])
        killer = threading.Timer(0.3, lambda: os.kill(pids[1], signal.SIGKILL))
        killer.start()
        bundle = write_bundle(pids[0], snapshot, tmp_path / "out", native=True)
        killer.join()
        assert (bundle / "summary.md").is_file() and (bundle / "snapshot.json").is_file()
        assert not list((tmp_path / "out").glob("*.partial"))
    finally:
        _stop(job)


# ---- open

def test_open_directory_tarball_and_summary(canary_job, capsys):
    job, pids, tmp = canary_job
    snapshot = _snapshot(pids[0])
    for tar in (False, True):
        bundle = write_bundle(pids[0], snapshot, tmp / "out-open", native=False, tar=tar)
        source = BundleSource(bundle)
        try:
            snap = source.poll()
            assert snap.source == f"bundle:{bundle}"
            assert {r.rank for r in snap.ranks} == {0, 1}
            logs = [r.log_path for r in snap.ranks if r.log_path]
            assert logs and all(Path(p).is_file() and str(source.root) in p for p in logs)
        finally:
            source.close()
        assert cli(["open", str(bundle), "--summary"]) == 0
        assert "# trainwatch evidence" in capsys.readouterr().out


def test_open_damaged_or_foreign_bundles(tmp_path, capsys):
    (tmp_path / "junk.tar.gz").write_bytes(b"\x1f\x8b not really")
    (tmp_path / "foreign").mkdir()
    (tmp_path / "foreign" / "bundle.json").write_text('{"format": "something-else"}')
    (tmp_path / "damaged").mkdir()
    (tmp_path / "damaged" / "bundle.json").write_text('{"format": "trainwatch-bundle", "version": 1}')
    (tmp_path / "damaged" / "snapshot.json").write_text('{"job": {"launcher": 3}}')
    for name in ("junk.tar.gz", "foreign", "damaged", "absent"):
        with pytest.raises(BadBundle):
            BundleSource(tmp_path / name)
        assert cli(["open", str(tmp_path / name), "--summary"]) == BadBundle.exit_code
        assert "Traceback" not in capsys.readouterr().err
