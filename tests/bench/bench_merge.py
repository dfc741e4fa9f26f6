"""Benchmark: merge node snapshots and judge the whole job at 1,024 and 8,192 ranks.

Stacks come from recorded py-spy dumps (tests/fixtures/pyspy), 8 ranks per node, one rank
stuck elsewhere, one node unreadable (its ranks must come back ``unknown``, never culprits).
Run: ``python tests/bench/bench_merge.py [--sizes 1024,8192]`` (prints the figures; exits 1 if a
correctness check fails). tests/bench/test_benches.py runs it at a small size.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import replace
from pathlib import Path

from trainwatch.probes.judge.phases import classify
from trainwatch.probes.read.stacks.pyspy import parse_dump
from trainwatch.probes.remote.merge import NodeView, merge_nodes
from trainwatch.probes.snapshot import Frame, HostInfo, Job, Rank, Snapshot, ThreadStack

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "pyspy"
PER_NODE = 8


def recorded_threads(name: str) -> tuple[ThreadStack, ...]:
    data = json.loads((FIXTURES / name).read_text())
    pid = data[0].get("pid") or data[0].get("os_thread_id")
    return tuple(parse_dump(data, pid))


def compute_threads(base: tuple[ThreadStack, ...]) -> tuple[ThreadStack, ...]:
    """The recorded stack with the collective replaced by the user's forward pass."""
    main = base[0]
    outer = tuple(f for f in main.frames if "distributed_c10d" not in f.file and "c10d_logger" not in f.file)
    inner = (Frame("forward", "/w/.venv/lib/python3.11/site-packages/torch/nn/modules/linear.py", 125),
             Frame("compute_step", "/w/train.py", 37))
    return (replace(main, frames=inner + outer[1:], active=True), *base[1:])


def rank_from(n: int, host: str, threads: tuple[ThreadStack, ...]) -> Rank:
    c = classify(threads)
    return Rank(rank=n, pid=10_000 + n, host=host, local_rank=n % PER_NODE, state="stuck", phase=c.phase,
                op=c.op, where=c.where, user_frame=c.user_frame, stuck_for_s=42.0, cpu_pct=1.0,
                rss_bytes=2 << 30, threads=threads, detail=c.detail)


def node_snapshots(world: int) -> list[Snapshot]:
    waiting = recorded_threads("gloo_all_gather.json")
    late = compute_threads(waiting)
    snaps = []
    for node in range(world // PER_NODE):
        host = f"node{node:04d}"
        ranks = tuple(rank_from(n, host, late if n == world - 1 else waiting)
                      for n in range(node * PER_NODE, (node + 1) * PER_NODE))
        job = Job(launcher="torchrun", pid=1000 + node, host=host, world_size=world, local_world_size=PER_NODE,
                  nnodes=world // PER_NODE, master_addr="node0000", master_port=29500)
        snaps.append(Snapshot(job=job, ranks=ranks, hosts=(HostInfo(name=host),), taken_at=time.time(),
                              window_s=3.0))
    return snaps


def bench(world: int) -> dict[str, float]:
    snaps = node_snapshots(world)
    texts = [s.to_json(indent=None) for s in snaps]
    started = time.perf_counter()
    decoded = [Snapshot.from_json(t) for t in texts]
    decode_s = time.perf_counter() - started
    # One node unreachable: its ranks come back unknown, never culprits.
    views = [NodeView(s.job.host, s, local=(i == 0)) for i, s in enumerate(decoded)]
    views[len(views) // 2] = NodeView(views[len(views) // 2].name, error="unreachable")
    started = time.perf_counter()
    merged = merge_nodes(views)
    merge_s = time.perf_counter() - started
    assert merged.verdict.culprits == (world - 1,), merged.verdict
    assert sum(r.state == "unknown" for r in merged.ranks) == PER_NODE
    assert not any(r.state == "missing" for r in merged.ranks)
    assert "not read: " in merged.verdict.summary, merged.verdict
    return {"ranks": world, "nodes": len(snaps), "json_kib": sum(map(len, texts)) / 1024,
            "decode_s": decode_s, "merge_verdict_s": merge_s, "groups": len(merged.groups)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="1024,8192", help="world sizes, comma-separated (multiples of 8)")
    args = parser.parse_args(argv)
    for world in (int(w) for w in args.sizes.split(",")):
        r = bench(world)
        print(f"{r['ranks']:>5} ranks on {r['nodes']:>4} nodes: merge+groups+verdict {r['merge_verdict_s'] * 1000:7.1f} ms"
              f" | decode node JSON {r['decode_s'] * 1000:7.1f} ms ({r['json_kib']:.0f} KiB) | {r['groups']} groups")
    return 0


if __name__ == "__main__":
    sys.exit(main())
