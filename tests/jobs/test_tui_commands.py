"""`trainwatch attach` and `trainwatch demo` at the command line (the screen itself is tested elsewhere)."""

from __future__ import annotations

import importlib.util
import subprocess
import sys

import pytest

from trainwatch.tui.cli import main
from trainwatch.tui.commands import demo


def dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


@pytest.fixture
def terminal(monkeypatch):
    """stdout as a terminal, as when a person runs `trainwatch attach` (pytest captures it)."""
    monkeypatch.setattr("trainwatch.tui.commands.common.stdout_is_terminal", lambda: True)


def test_attach_bad_pid_is_a_clear_error_before_any_screen(capsys, terminal):
    pid = dead_pid()
    code = main(["attach", str(pid)])
    err = capsys.readouterr().err
    assert code == 3
    assert f"no process with PID {pid}" in err
    assert "Traceback" not in err


def test_attach_rejects_a_zero_interval(capsys, terminal):
    assert main(["attach", "1", "--interval", "0"]) == 2  # usage
    assert "argument --interval: seconds greater than 0, not 0" in capsys.readouterr().err


def test_attach_out_that_cannot_be_written_fails_before_the_screen(capsys, terminal, tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    assert main(["attach", "1", "--out", str(blocker / "bundles")]) == 8
    err = capsys.readouterr().err
    assert f"cannot write evidence into {blocker / 'bundles'}: {blocker} is a file, not a folder" in err
    assert "pass a writable folder as --out" in err


def test_attach_closes_its_source_and_prints_the_bundles_on_exit(monkeypatch, capsys, terminal, tmp_path):
    from tui_samples import ListSource, straggler

    import trainwatch.probes.live as live
    import trainwatch.tui.app as app_module

    source = ListSource(straggler())
    source.job = None  # what wrap_remote reads when no other node is named
    monkeypatch.setattr(live, "open_source", lambda pid, window, **kwargs: source)
    import trainwatch.probes as probes  # the front door caches what it handed out before
    monkeypatch.setattr(probes, "open_source", live.open_source, raising=False)
    seen = {}

    def run(app):  # stands in for the screen: a person pressed d, then q
        seen["dump_dir"] = app.dump_dir
        app.dumps.append(tmp_path / "out" / "trainwatch-node1-4242-20231114T223000Z")

    monkeypatch.setattr(app_module.TrainwatchApp, "run", run)
    assert main(["attach", "4242", "--out", str(tmp_path / "out")]) == 0
    assert seen["dump_dir"] == tmp_path / "out" and (tmp_path / "out").is_dir()
    assert source.closed
    out = capsys.readouterr().out
    assert f"trainwatch: evidence bundle written to {tmp_path / 'out' / 'trainwatch-node1-4242-20231114T223000Z'}" in out


def test_demo_without_torch_says_how_to_get_it(monkeypatch, capsys):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "torch" else real(name, *a))
    assert main(["demo", "--no-tui"]) == 1
    assert "trainwatch: demo needs PyTorch in this environment: pip install torch" in capsys.readouterr().err


@pytest.mark.job
@pytest.mark.slow
def test_demo_no_tui_prints_the_table_and_stops_its_job(monkeypatch, capsys):
    stopped = []
    original = demo.DemoJob.stop

    def stop(self):
        original(self)
        stopped.append(self.proc.poll())

    monkeypatch.setattr(demo.DemoJob, "stop", stop)
    assert main(["demo", "--no-tui", "--ranks", "2", "--scenario", "straggler", "--deadline", "60"]) == 0
    captured = capsys.readouterr()
    assert "torchrun" in captured.out and "train.py" in captured.out
    assert stopped and stopped[0] is not None  # the demo job is gone
    steps = captured.err.splitlines()  # what the demo says while its job starts, a line per step
    assert "torchrun started (PID" in steps[1] and "2 rank processes running; each imports torch" in steps[2], steps
    assert "ranks in the process group: 2/2" in steps[-2] and "attaching: the first sample" in steps[-1], steps


def test_snapshot_closes_the_multi_node_source_it_wrapped(monkeypatch, capsys):
    """The wrapper (a StreamSource over the nodes in real life) is what gets closed: it ends remote calls."""
    from tui_samples import ListSource, straggler

    import trainwatch.probes as probes
    import trainwatch.tui.commands.snapshot as snapshot_cmd

    local = ListSource(straggler())
    wrapped = ListSource(straggler())
    # the command imports these from the probes API when it runs (not at start-up)
    monkeypatch.setattr(probes, "LocalSource", lambda pid, window, samples, **kwargs: local)
    monkeypatch.setattr(probes, "find_pyspy", lambda: None)
    monkeypatch.setattr(snapshot_cmd, "wrap_remote", lambda args, source: wrapped)
    assert main(["snapshot", "4242", "--json"]) == 0
    assert wrapped.closed and len(wrapped.calls) == 1
    assert '"kind": "straggler"' in capsys.readouterr().out
