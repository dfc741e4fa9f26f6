"""The in-process hook: a no-op where it should be, chains sitecustomize, answers while blocked."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from real_jobs import rank_stuck_at, wait_until
from trainwatch.probes import hook, rundir
from trainwatch.probes.judge.progress import CompletedCollectives
from trainwatch.probes.read.collectives import flightrec
from trainwatch.probes.read.collectives import hookclient

PROBE = """
import json, os, sys, threading
print(json.dumps({"threads": sorted(t.name for t in threading.enumerate()),
                  "torch": "torch" in sys.modules,
                  "hook": any("trainwatch" in m and "hook" in m for m in sys.modules),
                  "marker": os.environ.get("CHAINED_MARKER")}))
"""


def run_probe(tmp_path: Path, env: dict[str, str], code: str = PROBE) -> dict:
    full = {k: v for k, v in os.environ.items() if k not in ("RANK", "TRAINWATCH_ARMED_PID")}
    full.update(env)
    out = subprocess.run([sys.executable, "-c", code], env=full, capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def armed(run_dir: Path, **extra: str) -> dict[str, str]:
    env, _ = rundir.armed_env(run_dir, {"PATH": os.environ["PATH"]})
    return {**env, **extra}


def test_unarmed_process_is_untouched(tmp_path):
    env = {"PYTHONPATH": str(rundir.HOOK_DIR), "RANK": "0"}  # hook on the path, not enabled
    seen = run_probe(tmp_path, env)
    assert seen["threads"] == ["MainThread"] and not seen["hook"] and not seen["torch"]


def test_launcher_without_rank_is_not_armed(tmp_path):
    seen = run_probe(tmp_path, armed(tmp_path / "run"))
    assert seen["threads"] == ["MainThread"] and not seen["hook"]
    assert not (tmp_path / "run" / "ranks").exists()


def test_rank_is_armed_without_importing_torch(tmp_path):
    seen = run_probe(tmp_path, armed(tmp_path / "run", RANK="1"))
    assert "trainwatch-hook" in seen["threads"] and not seen["torch"]
    record = json.loads(rundir.hook_json(tmp_path / "run", 1).read_text())
    assert record["faulthandler_signal"] == rundir.FAULTHANDLER_SIGNAL
    assert "trainwatch-hook" in rundir.rank_log_file(tmp_path / "run", 1).read_text()  # output teed


def test_rank_is_armed_by_an_interpreter_without_trainwatch(tmp_path):
    """The job's own Python may lack trainwatch: the sitecustomize loads the hook, and it rundir, by path."""
    base = Path(sys.base_prefix) / "bin" / "python3"
    has_trainwatch = subprocess.run([base, "-c", "import trainwatch"], capture_output=True).returncode == 0
    if sys.prefix == sys.base_prefix or has_trainwatch:
        pytest.skip("needs an interpreter that cannot import trainwatch (the base of this virtualenv)")
    env = {**armed(tmp_path / "run", RANK="2"), "PYTHONNOUSERSITE": "1"}
    out = subprocess.run([base, "-c", PROBE], env=env, capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert out.returncode == 0 and "hook not installed" not in out.stderr, out.stderr
    assert "trainwatch-hook" in json.loads(out.stdout.strip().splitlines()[-1])["threads"]
    assert json.loads(rundir.hook_json(tmp_path / "run", 2).read_text())["rank"] == 2


def test_children_of_a_rank_are_not_armed(tmp_path):
    """A DataLoader worker inherits RANK (and the armed environment): it must stay unarmed."""
    child = PROBE.replace("\n", "\\n").replace('"', '\\"')
    code = ("import subprocess, sys; r = subprocess.run([sys.executable, '-c', \"" + child + "\"], "
            "capture_output=True, text=True); print(r.stdout.strip())")
    seen = run_probe(tmp_path, armed(tmp_path / "run", RANK="0"), code)
    assert seen["threads"] == ["MainThread"] and not seen["hook"]
    assert sorted(p.name for p in (tmp_path / "run" / "ranks").iterdir()) == ["0"]


def test_chains_an_existing_sitecustomize(tmp_path):
    other = tmp_path / "site"
    other.mkdir()
    (other / "sitecustomize.py").write_text("import os\nos.environ['CHAINED_MARKER'] = 'ran'\n")
    env = armed(tmp_path / "run", RANK="0")
    env["PYTHONPATH"] += os.pathsep + str(other)
    seen = run_probe(tmp_path, env)
    assert seen["marker"] == "ran" and "trainwatch-hook" in seen["threads"]
    unarmed = run_probe(tmp_path, {"PYTHONPATH": f"{rundir.HOOK_DIR}{os.pathsep}{other}"})
    assert unarmed["marker"] == "ran"


@pytest.mark.job
def test_hook_answers_while_rank_is_blocked_in_gloo(planted, tmp_path):
    run_dir = tmp_path / "run"
    env, _ = rundir.armed_env(run_dir, {})
    env.pop("PYTHONPATH")
    job = planted("mismatch", nproc=2, deadline=40, extra_env={**env, "PYTHONPATH": str(rundir.HOOK_DIR)})
    for line, who in (("dist.all_gather(gathered", "the culprit"), ("dist.all_reduce(param.grad)", "the other rank")):
        wait_until(lambda: rank_stuck_at(job.script, line), 60, f"{who} blocked on {line!r}")
    ranks = hookclient.armed_ranks(run_dir)
    assert sorted(ranks) == [0, 1]
    for rank, sock in ranks.items():
        assert oct(sock.stat().st_mode & 0o777) == "0o600"
        trace = hookclient.request(sock, "fr_trace", timeout=10)
        assert trace.ok, trace.error
        [(recorder, parsed)], _ = flightrec.hook_reply_traces(trace.text)  # gloo: the generic recorder only
        entries = parsed["entries"]
        assert recorder == "generic" and entries and entries[-1]["profiling_name"].startswith("gloo:")
        stacks = hookclient.request(sock, "stacks", timeout=10)
        assert stacks.ok and '"MainThread"' in stacks.text
        blocked = "sync_metrics" if rank == 1 else "sync_gradients"
        assert blocked in stacks.text
    assert entries[-1]["profiling_name"] == "gloo:all_gather"
    assert hookclient.request(ranks[0], "bogus").error.startswith("unknown command")
    assert job.alive()


FAKE_C10D = """
import json, sys, types
nccl_json, generic_json, mode = sys.argv[1], sys.argv[2], sys.argv[3]
calls = []
c10d = types.ModuleType("torch._C._distributed_c10d")
def _dump_nccl_trace_json(includeCollectives=None, onlyActive=None):
    calls.append({"includeCollectives": includeCollectives, "onlyActive": onlyActive})
    if mode == "nccl-fails":
        raise RuntimeError("no NCCL process group")
    return open(nccl_json, "rb").read()
def _dump_fr_trace_json():
    return open(generic_json, "rb").read()
c10d._dump_fr_trace_json = _dump_fr_trace_json
if mode != "no-nccl":  # a torch built with NCCL has its process group, and (but for "no-dump") the dump
    c10d.ProcessGroupNCCL = type("ProcessGroupNCCL", (), {})
if mode not in ("no-nccl", "no-dump"):
    c10d._dump_nccl_trace_json = _dump_nccl_trace_json
sys.modules["torch"] = types.ModuleType("torch")
sys.modules["torch._C._distributed_c10d"] = c10d
from trainwatch.probes import hook
print(json.dumps({"reply": hook.fr_trace(), "calls": calls}))
"""


@pytest.mark.parametrize("mode", ["both", "no-nccl", "no-dump", "nccl-fails"])
def test_fr_trace_asks_both_recorders(tmp_path, mode):
    """torch's private c10d module is replaced (no GPU here); the dumps it returns are the real
    H100 recordings: NCCL's own recorder, and the generic one that is empty on NCCL jobs. A torch
    built without NCCL (CPU) says nothing of NCCL's recorder: the job cannot use NCCL."""
    h100 = Path(__file__).parents[1] / "fixtures" / "fr" / "h100"
    nccl = h100 / "hook-dump_nccl_trace_json-hung.json"
    gloo = Path(__file__).parents[1] / "fixtures" / "fr" / "gloo-2.13" / "mismatch" / "rank0.json"
    generic = h100 / "hook-dump_fr_trace_json-nccl-job-EMPTY.json" if mode == "both" else gloo
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "TRAINWATCH_ARMED_PID")}
    out = subprocess.run([sys.executable, "-c", FAKE_C10D, str(nccl), str(generic), mode], env=env,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout)
    reply = result["reply"]
    assert reply["ok"], reply
    traces, notes = flightrec.hook_reply_traces(reply["text"])
    if mode == "both":
        assert result["calls"] == [{"includeCollectives": True, "onlyActive": False}]
        assert [name for name, _ in traces] == ["nccl"]
        [row] = flightrec.read_rows({0: flightrec.merge_traces([t for _, t in traces])}).ranks
        assert (row.pending_seq, row.pending_op, row.last_completed) == (544, "all_reduce", 543)
    else:
        assert [name for name, _ in traces] == ["generic"]
        if mode == "no-nccl":
            assert notes == [], notes
        else:
            assert ("no torch._C._distributed_c10d._dump_nccl_trace_json" if mode == "no-dump"
                    else "RuntimeError: no NCCL process group") in notes[0]
    assert hook.FR_FORMAT == flightrec.HOOK_FORMAT


@pytest.mark.parametrize("setup, error", [
    ("", "torch is not imported in this process"),
    ("import sys, types; sys.modules['torch'] = types.ModuleType('torch')\n",  # no torch.distributed
     "no torch._C._distributed_c10d._dump_fr_trace_json"),
])
def test_fr_trace_without_a_recorder_is_an_error_not_a_crash(setup, error):
    code = setup + "import json\nfrom trainwatch.probes import hook\nprint(json.dumps(hook.fr_trace()))"
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "TRAINWATCH_ARMED_PID")}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    reply = json.loads(out.stdout)
    assert not reply["ok"] and error in reply["error"], reply


@pytest.mark.job
def test_live_source_judges_an_armed_mismatch_by_its_flight_recorder(planted, tmp_path):
    """`trainwatch run` arms the job; the live source's poll carries the hooks' Flight Recorder
    and its verdict names the first sequence number where the two ranks disagree."""
    from trainwatch.probes.live import LocalSource

    prefix = [sys.executable, "-m", "trainwatch.tui.cli", "run", "--out", str(tmp_path / "run"), "--"]
    job = planted("mismatch", nproc=2, deadline=60, prefix=prefix)
    source = LocalSource(job.pid, window=0.5, samples=2, gpu=False)
    try:
        deadline = time.monotonic() + 30
        snap = source.poll()
        while time.monotonic() < deadline and (snap.collectives is None or not snap.collectives.divergence):
            time.sleep(0.5)  # the planted fault comes at step 3, and the feed fetches in the background
            snap = source.poll()
        state = snap.collectives
        assert state is not None and state.source == "hook", snap.notes
        assert state.divergence.startswith("ranks disagree at #"), state.divergence
        assert "rank 0 enqueued all_reduce" in state.divergence and "rank 1 enqueued all_gather" in state.divergence
        assert {(r.rank, r.pending_op) for r in state.ranks} == {(0, "all_reduce"), (1, "all_gather")}
        assert snap.verdict.kind == "mismatch" and snap.verdict.culprits == ()  # one against one: no coin toss
        assert snap.verdict.summary == f"{state.divergence} (Flight Recorder, hook)"
        seen = CompletedCollectives()  # what the live source keeps between polls
        seen.advanced(state)
        for _ in range(2):  # two more fetches, both during the hang (each poll starts one, a second apart)
            time.sleep(1.1)
            source.poll()
            assert seen.advanced(source._feed.wait(10)) == set()  # hung: its completed collectives do not advance
        assert job.alive()
    finally:
        source.close()
