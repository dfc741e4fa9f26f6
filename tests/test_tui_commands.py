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


def test_attach_bad_pid_is_a_clear_error_before_any_screen(capsys):
    pid = dead_pid()
    code = main(["attach", str(pid)])
    err = capsys.readouterr().err
    assert code == 3
    assert f"no process with PID {pid}" in err
    assert "Traceback" not in err


def test_attach_rejects_a_zero_interval(capsys):
    assert main(["attach", "1", "--interval", "0"]) == 1
    assert "--interval must be more than 0" in capsys.readouterr().err


def test_demo_without_torch_says_how_to_get_it(monkeypatch, capsys):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "torch" else real(name, *a))
    assert main(["demo", "--no-tui"]) == 1
    assert "trainwatch demo needs PyTorch in this environment: pip install torch" in capsys.readouterr().err


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
    out = capsys.readouterr().out
    assert "torchrun" in out and "train.py" in out
    assert stopped and stopped[0] is not None  # the demo job is gone
