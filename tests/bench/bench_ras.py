"""Benchmark: one NCCL RAS poll, and parse + judgement of a big job's report.

1. One poll (connect, handshake, TIMEOUT, SET FORMAT, VERBOSE STATUS, read to close) against the
   loopback RAS stand-in (tests/ras_server.py) replaying each synthetic fixture: time and bytes.
2. A JSON report scaled to 1,024 ranks x 8 communicators (8,192 rank entries, NCCL's layout),
   one rank behind: parse, then judge a second poll against the first (goal: under 50 ms).

Run: ``python tests/bench/bench_ras.py`` (prints figures and ratios). ``main(small=True)`` runs
it at 64 ranks x 2 communicators and returns the results, for tests/bench/test_bench_ras.py.
"""

from __future__ import annotations

import gc
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/ (ras_server) when run as a script

from ras_server import RasServer, takes  # noqa: E402
from trainwatch.probes.judge.ras import RasTracker  # noqa: E402
from trainwatch.probes.read.collectives import ras, ras_report  # noqa: E402

GOAL_MS = 50.0
OPS = ("Broadcast", "Reduce", "AllGather", "ReduceScatter", "AllReduce")


def scaled_report(ranks: int, comms: int, behind: int | None = None, per_node: int = 8) -> str:
    """A RAS JSON report of ``comms`` communicators over ``ranks`` ranks; ``behind``: that rank one
    AllReduce behind in the first communicator."""
    def rank(n: int, count: int) -> dict:
        return {"rank": n, "host": f"10.1.{n // per_node // 256}.{n // per_node % 256}", "pid": 10000 + n,
                "cuda_dev": n % per_node, "nvml_dev": n % per_node,
                "status": {"init_state": 0, "async_error": 0, "finalize_called": False, "destroy_flag": False,
                           "abort_flag": False},
                "collective_counts": {op: (count if op == "AllReduce" else 3) for op in OPS}}
    communicators = []
    for c in range(comms):
        members = [rank(n, 1204 if (c == 0 and n == behind) else 1205) for n in range(ranks)]
        communicators.append({"hash": f"0x{0x1000 + c:x}", "secondary_hash": "0x1:0x2", "size": ranks,
                              "ranks_count": ranks, "missing_ranks_count": 0, "ranks": members,
                              "missing_ranks": []})
    return json.dumps({"nccl_version": "2.29.7", "cuda_runtime_version": 13000, "cuda_driver_version": 13000,
                       "timestamp": "2026-11-23 14:00:00", "communicators_count": comms,
                       "communicators": communicators, "ras": {"collection_time_sec": 0.01, "timeouts_count": 0}},
                      indent=2) + "\n"


def poll_costs(repeat: int) -> list[dict]:
    """One RAS poll per fixture scenario and format: median time, bytes received and sent."""
    rows = []
    for name in ("healthy", "straggler", "mismatch", "dead", "unreachable", "other-job"):
        for json_ok in (True, False):
            times, reply = [], None
            with RasServer(takes(name)[:1], json_supported=json_ok) as server:
                for _ in range(repeat):
                    reply = ras.query("127.0.0.1", server.port)
                    times.append(reply.elapsed_s)
            assert reply is not None and reply.report is not None, reply and reply.note
            rows.append({"fixture": name, "format": reply.format, "ms": statistics.median(times) * 1000,
                         "received": len(reply.raw or b""), "sent": reply.sent_bytes})
    return rows


def judge_cost(ranks: int, comms: int, repeat: int) -> dict:
    """Parse two polls of a scaled report and judge them: the second poll's cost is what a live view pays."""
    texts = [scaled_report(ranks, comms, behind=ranks - 3) for _ in range(2)]
    parse_ms, judge_ms, cpu_ms, state = [], [], [], None
    for _ in range(repeat):
        tracker = RasTracker()
        tracker.observe(ras_report.parse(texts[0]), 1.0, "bench")
        cpu = time.thread_time()
        started = time.perf_counter()
        report = ras_report.parse(texts[1])
        parsed = time.perf_counter()
        state = tracker.observe(report, 4.0, "bench")
        done = time.perf_counter()
        cpu_ms.append((time.thread_time() - cpu) * 1000)
        parse_ms.append((parsed - started) * 1000)
        judge_ms.append((done - parsed) * 1000)
    assert state is not None and state.kind == "behind" and state.culprits == (ranks - 3,), state and state.finding
    decode_ms = []
    for _ in range(repeat):
        gc.disable()  # as the parser does
        started = time.perf_counter()
        json.loads(texts[1])
        decode_ms.append((time.perf_counter() - started) * 1000)
        gc.enable()
    return {"ranks": ranks, "comms": comms, "bytes": len(texts[1]), "parse_ms": min(parse_ms),
            "judge_ms": min(judge_ms), "decode_ms": min(decode_ms), "parse_median_ms": statistics.median(parse_ms),
            "judge_median_ms": statistics.median(judge_ms), "cpu_ms": min(cpu_ms), "finding": state.finding,
            "rows_kept": len(state.ranks)}


def main(small: bool = False) -> dict:
    polls = poll_costs(repeat=3 if small else 20)
    scaled = judge_cost(64, 2, 1) if small else judge_cost(1024, 8, 7)
    if not small:
        print("One RAS poll against the loopback stand-in (median of 20):")
        print(f"  {'fixture':<12} {'format':<6} {'ms':>7} {'received B':>11} {'sent B':>7}")
        for row in polls:
            print(f"  {row['fixture']:<12} {row['format']:<6} {row['ms']:7.2f} {row['received']:11d} {row['sent']:7d}")
        json_rows = [r for r in polls if r["format"] == "json"]
        text_rows = [r for r in polls if r["format"] == "text"]
        ratio = statistics.mean(r["received"] for r in json_rows) / statistics.mean(r["received"] for r in text_rows)
        print(f"  JSON / text bytes: {ratio:.1f}x")
        total = scaled["parse_ms"] + scaled["judge_ms"]
        print(f"\n{scaled['ranks']} ranks x {scaled['comms']} communicators ({scaled['bytes'] / 1e6:.1f} MB JSON), "
              f"best of 7 (median in brackets):")
        print(f"  parse {scaled['parse_ms']:.1f} ms [{scaled['parse_median_ms']:.1f}] (of which json.loads "
              f"{scaled['decode_ms']:.1f} ms) + judge {scaled['judge_ms']:.1f} ms [{scaled['judge_median_ms']:.1f}] "
              f"= {total:.1f} ms ({total / GOAL_MS:.2f}x the {GOAL_MS:.0f} ms goal)")
        print(f"  CPU time of parse + judge (this thread; steadier than wall time on a shared machine): "
              f"{scaled['cpu_ms']:.1f} ms ({scaled['cpu_ms'] / GOAL_MS:.2f}x the goal)")
        print(f"  rows kept in the snapshot: {scaled['rows_kept']}")
        print(f"  finding: {scaled['finding']}")
    return {"polls": polls, "scaled": scaled}


if __name__ == "__main__":
    main()
