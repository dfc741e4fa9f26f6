"""Every benchmark runs here at a small size and must pass its correctness checks (never its timings),
so a benchmark cannot rot unnoticed. A new bench_*.py must be listed below."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

# Benchmarks on data in memory: quick.
PURE = {
    "bench_merge": ["--sizes", "64,128"],
    "bench_gpu": ["--ticks", "3"],
    "bench_restarts": ["--restarts", "40"],
    "bench_fanout": ["--nodes", "12", "--polls", "2", "--window", "0.5", "--interval", "0.5", "--start", "0.05", "0.2",
                    "--relay-from", "4", "--bundle-kib", "64", "--bundle-timeout", "1.5",
                    "--dump", "0.1", "0.3"],
}
# Benchmarks that start real jobs.
JOBS = {
    "bench_snapshot": ["--ranks", "2", "--repeat", "1"],
    "bench_steps": ["--ranks", "2", "--repeat", "1"],
    "bench_dump": ["--nproc", "2", "--repeat", "1"],
    "bench_first_verdict": ["--ranks", "2", "--window", "1"],
    "bench_hook": ["--seconds", "2", "--nproc", "1", "--rounds", "1"],
    "bench_attach": ["--ranks", "2", "--seconds", "8", "--interval", "1"],
    "bench_look_cost": ["--threads", "16", "--seconds", "2", "--modes", "attach,watch"],
    "bench_native": ["--ranks", "2", "--seconds", "2", "--polls", "2"],
    "bench_latency": ["--reps", "1", "--ranks", "2", "--stall-min", "3", "--stall-max", "4", "--modes", "attach"],
}
# Benchmarks with a test file of their own (stronger checks on what they return).
OWN_TEST = {"bench_ras": "test_bench_ras.py"}


def test_every_benchmark_is_run_here():
    assert sorted(p.stem for p in HERE.glob("bench_*.py")) == sorted([*PURE, *JOBS, *OWN_TEST])
    assert all((HERE / test).exists() for test in OWN_TEST.values())


@pytest.mark.parametrize("name", sorted(PURE))
def test_benchmark_checks_hold_at_a_small_size(name, capsys):
    assert importlib.import_module(name).main(PURE[name]) == 0
    assert capsys.readouterr().out.strip()  # it printed its figures


@pytest.mark.job
@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(JOBS))
def test_benchmark_on_real_jobs_checks_hold_at_a_small_size(name, capsys):
    assert importlib.import_module(name).main(JOBS[name]) == 0
    assert capsys.readouterr().out.strip()
