"""Fan-out to 1,024 nodes x 8 ranks: the real StreamSource against replayed node agents.

Every node's answer is built with the real encoder (probes/remote/wire.py) from recorded py-spy
stacks (tests/fixtures/pyspy), one straggler rank on the last node. A separate "cluster" process
replays them: each launch's pipes are handed to it (SCM_RIGHTS), and it writes each node's
hello after a start-up latency (ssh or srun fan-out plus the interpreter's start, with jitter),
its first answer one window later (or, once the viewer calls for the first answers, as soon as
half the window is watched), then one line per interval with jitter, exactly as agents do.
The viewer side is the real code: the fan-out (one srun step, or one launch per node as with
ssh), the epoll reader, decoding, the merge and the judgement.

    python tests/bench/bench_fanout.py [--nodes 1024] [--per-node 8] [--transport slurm|ssh] [--polls 5]

Prints the time to the first complete verdict, the viewer's CPU per poll, bytes per node per
poll, the time to bring every node's bundle back through the agents (a dump: each replayed agent
answers the request after 2-7 s with a 256 KiB .tar.gz; two never answer and must be named), and
decode + merge + judgement at nodes x per-node ranks, beside the same work done the old way
(every node's full snapshot JSON). Exits 1 when a correctness check fails.
"""

from __future__ import annotations

import argparse
import heapq
import io
import json
import os
import random
import resource
import selectors
import socket
import sys
import tarfile
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_merge import PER_NODE, compute_threads, rank_from, recorded_threads  # noqa: E402

from trainwatch.probes.remote.merge import NodeView, merge_nodes  # noqa: E402
from trainwatch.probes.remote.reach import SlurmRemote, SshRemote  # noqa: E402
from trainwatch.probes.remote.node_spec import RELAY_FROM  # noqa: E402
from trainwatch.probes.live import MIN_FIRST_LOOK  # noqa: E402
from trainwatch.probes.remote.streams import FIRST_CALL_S, STREAM_START_PARALLEL, StreamSource  # noqa: E402
from trainwatch.probes.remote.launches import Launch  # noqa: E402
from trainwatch.probes.remote.wire import bundle_lines, decode_line, encode_line  # noqa: E402
from trainwatch.probes.snapshot import HostInfo, Job, Snapshot, Verdict  # noqa: E402

BEFORE_8192_S = 18.4  # decode + merge + judgement at 8,192 ranks before issue 16 (docs/benchmarks.md)


def node_snapshots(nodes: int, per_node: int) -> list[Snapshot]:
    """Each node's own snapshot as its agent would take it; the last rank of the job is in compute."""
    waiting = recorded_threads("gloo_all_gather.json")
    late = compute_threads(waiting)
    world = nodes * per_node
    snaps = []
    for node in range(nodes):
        host = f"node{node:04d}"
        ranks = tuple(rank_from(n, host, late if n == world - 1 else waiting)
                      for n in range(node * per_node, (node + 1) * per_node))
        verdict = Verdict("straggler", (world - 1,), "") if node == nodes - 1 else Verdict("hang", (), "")
        job = Job(launcher="torchrun", pid=1000 + node, host=host, world_size=world, local_world_size=per_node,
                  nnodes=nodes, master_addr="node0000", master_port=29500)
        snaps.append(Snapshot(job=job, ranks=ranks, verdict=verdict, hosts=(HostInfo(name=host),),
                              taken_at=time.time(), window_s=2.0))
    return snaps


# --- the replayed cluster: a process of its own, so the viewer's CPU is the viewer's alone ----------------

@dataclass
class Timing:
    start_s: tuple[float, float]  # hello after uniform(a, b) seconds: ssh/srun fan-out and interpreter start
    relay_s: tuple[float, float]  # a relay's agents start after uniform(a, b) seconds: ssh to it, its start
    window: float
    interval: float
    jitter: float
    dump_s: tuple[float, float] = (2.0, 7.0)  # writing a node's bundle (bench_dump: 2.2 s, 6.7 s with native)
    silent: frozenset[str] = frozenset()  # nodes whose agents never send their bundle


def cluster(control: socket.socket, lines: dict[str, bytes], timing: Timing, seed: int, archive: bytes) -> None:
    """Receive launches (names + pipe ends) and write each node's lines on the agents' schedule; a
    bundle request on a launch's stdin is answered, for each of its nodes but the silent ones, with
    ``archive`` as wire lines after the time a dump takes."""
    rng = random.Random(seed)
    # (when, order, fd, node, label, said hello, bundle lines to write once, its answers' chain)
    events: list[tuple[float, int, int, str, bytes, bool, bytes, int]] = []
    order = 0
    # The first answers called for (streams.FIRST_CALL): an agent still in its first window answers
    # once it has watched MIN_FIRST_LOOK of it. (stdout fd, node) -> when it said hello; answered.
    hello_at: dict[tuple[int, str], float] = {}
    first_sent: set[tuple[int, str]] = set()
    called: set[int] = set()  # stdout fds of launches whose agents were called
    chain: dict[tuple[int, str], int] = {}  # a node's answers: a call starts a new chain, the old one stops
    selector = selectors.DefaultSelector()
    selector.register(control, selectors.EVENT_READ)
    dead: set[int] = set()
    launches: dict[int, tuple[int, list[str], bool]] = {}  # stdin fd -> (stdout fd, names, labelled)
    parent = os.getppid()
    while os.getppid() == parent:  # never outlive the benchmark
        timeout = max(0.0, events[0][0] - time.monotonic()) if events else 0.05
        for key, _ in selector.select(timeout=min(timeout, 0.05)):
            if key.fileobj is not control:  # a request on a launch's stdin
                out, names, labelled = launches[key.fd]
                data = os.read(key.fd, 1 << 16)
                if not data:
                    selector.unregister(key.fd)
                    continue
                for request in data.splitlines():
                    if json.loads(request).get("answer") == "first":
                        called.add(out)
                        for task, name in enumerate(names):
                            if (out, name) in hello_at and (out, name) not in first_sent:
                                label = f"{task}: ".encode() if labelled else b""
                                when = max(time.monotonic(), hello_at[out, name] + MIN_FIRST_LOOK * timing.window)
                                chain[out, name] = chain.get((out, name), 0) + 1
                                heapq.heappush(events, (when + rng.uniform(0, timing.jitter), order, out, name, label,
                                                        True, b"", chain[out, name]))
                                order += 1
                        continue
                    bundle = json.loads(request).get("bundle")
                    for task, name in enumerate(names):
                        if bundle is None or name in timing.silent:
                            continue
                        label = f"{task}: ".encode() if labelled else b""
                        payload = b"".join(label + line.encode() + b"\n"
                                           for line in bundle_lines(name, bundle, archive))
                        heapq.heappush(events, (time.monotonic() + rng.uniform(*timing.dump_s), order, out, name,
                                                label, True, payload, 0))
                        order += 1
                continue
            msg, fds, _flags, _addr = socket.recv_fds(control, 1 << 20, 4)
            if not msg:
                return
            launch = json.loads(msg)
            out, err, stdin = fds
            os.close(err)  # no complaints on stderr: healthy agents
            launches[stdin] = (out, launch["names"], launch["labelled"])
            selector.register(stdin, selectors.EVENT_READ)
            now = time.monotonic()
            # a relay's agents start once it runs: their own ssh (from it) and start come after
            relay_up = now + (rng.uniform(*timing.relay_s) if launch["relayed"] else 0.0)
            for task, name in enumerate(launch["names"]):
                label = f"{task}: ".encode() if launch["labelled"] else b""
                heapq.heappush(events, (relay_up + rng.uniform(*timing.start_s), order, out, name, label, False, b"", 0))
                order += 1
        now = time.monotonic()
        while events and events[0][0] <= now:
            when, _, fd, name, label, hello_said, payload, link = heapq.heappop(events)
            if fd in dead or (hello_said and not payload and link != chain.get((fd, name), 0)):
                continue  # the viewer closed the launch; or an answer a call replaced
            try:
                if payload:
                    os.write(fd, payload)
                    continue
                os.write(fd, label + (lines[name] if hello_said else _hello(name)) + b"\n")
            except OSError:  # the viewer closed the launch
                dead.add(fd)
                continue
            if not hello_said:
                hello_at[fd, name] = when
                gap = MIN_FIRST_LOOK * timing.window if fd in called else timing.window
            else:
                first_sent.add((fd, name))
                gap = timing.interval
            heapq.heappush(events, (when + gap + rng.uniform(0, timing.jitter), order, fd, name, label, True, b"", link))
            order += 1


def _hello(name: str) -> bytes:
    return json.dumps({"kind": "trainwatch-node", "v": 1, "node": name, "hello": True}).encode()


class ReplayedAgent:
    """What StreamSource sees of a launch: pipes and a process that keeps running."""

    def __init__(self, control: socket.socket, launch: Launch, cluster_pid: int) -> None:
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        in_r, in_w = os.pipe()
        message = json.dumps({"names": launch.names, "labelled": launch.labelled, "relayed": launch.relayed}).encode()
        socket.send_fds(control, [message], [out_w, err_w, in_r])
        for fd in (out_w, err_w, in_r):
            os.close(fd)
        self.stdout, self.stderr, self.stdin = os.fdopen(out_r, "rb", 0), os.fdopen(err_r, "rb", 0), os.fdopen(in_w, "wb", 0)
        self.pid = cluster_pid

    def poll(self) -> int | None:
        return None

    def kill(self) -> None:
        for stream in (self.stdin, self.stdout, self.stderr):
            stream.close()


# --- the measurements ---------------------------------------------------------------------------------

def fan_out(nodes: int, per_node: int, transport: str, window: float, interval: float, polls: int,
            start_s: tuple[float, float], jitter: float, relay_s: tuple[float, float] = (0.2, 0.6),
            relay_from: int = RELAY_FROM, bundle_kib: int = 256, silent: int = 2,
            bundle_timeout: float = 20.0, dump_s: tuple[float, float] = (2.0, 7.0)) -> dict:
    """``transport``: slurm (one step), ssh (relays from RELAY_FROM hosts on), ssh-direct (one ssh per host)."""
    snaps = node_snapshots(nodes, per_node)
    lines = {s.job.host: encode_line(s, s.job.host, seq=1).encode() for s in snaps}
    quiet = frozenset(s.job.host for s in snaps[1:1 + silent])
    archive = _archive(bundle_kib)
    parent_sock, child_sock = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    _raise_nofile(4 * nodes + 256)
    pid = os.fork()
    if pid == 0:  # the cluster
        parent_sock.close()
        try:
            cluster(child_sock, lines, Timing(start_s, relay_s, window, interval, jitter, dump_s, quiet), seed=16,
                    archive=archive)
        finally:
            os._exit(0)
    child_sock.close()
    if transport == "slurm":
        remotes = [SlurmRemote(s.job.host, "4242") for s in snaps]
    else:
        remotes = [SshRemote(s.job.host) for s in snaps]
    world = nodes * per_node
    cpu0 = _cpu()
    started = time.monotonic()
    source = StreamSource(None, remotes, match=["--match", "node0000:29500"], interval=interval, window=window,
                          timeout=60, world_size=world, parallel=STREAM_START_PARALLEL,
                          spawn=lambda launch: ReplayedAgent(parent_sock, launch, pid),
                          relay_from=0 if transport == "ssh-direct" else relay_from)
    try:
        first = source.poll()
        first_s = time.monotonic() - started
        first_cpu = _cpu() - cpu0
        assert not [h for h in first.hosts if h.error], [h for h in first.hosts if h.error][:3]
        assert first.verdict.kind == "straggler" and first.verdict.culprits == (world - 1,), first.verdict
        assert len(first.ranks) == world and not any(r.state in ("missing", "unknown") for r in first.ranks)
        lines0, bytes0 = source.stats()["lines"], source.stats()["bytes"]
        cpu_start, wall_start = _cpu(), time.monotonic()
        poll_cpu = []
        for _ in range(polls):
            time.sleep(interval)
            before = _cpu()
            snap = source.poll()
            poll_cpu.append(_cpu() - before)
            assert snap.verdict.culprits == (world - 1,), snap.verdict
        wall = time.monotonic() - wall_start
        steady_cpu = _cpu() - cpu_start
        stats = source.stats()
        with tempfile.TemporaryDirectory(prefix="bench-bundles-") as out:
            started = time.monotonic()
            arrived = _when_all_arrived(source, nodes - len(quiet), started)
            notes = source.collect_bundles(Path(out), timeout=bundle_timeout)
            bundles_s = time.monotonic() - started
            hosts = Path(out) / "hosts"
            got = sorted(p.name for p in hosts.iterdir()) if hosts.is_dir() else []
        named = {note.split(":", 1)[0] for note in notes if ": no bundle: " in note}
        assert named == quiet, (sorted(named)[:5], sorted(quiet))
        assert len(got) == nodes - len(quiet), (len(got), notes[:3])
    finally:
        source.close()
        parent_sock.close()
        os.waitpid(pid, 0)
    answers = stats["lines"] - lines0
    return {"nodes": nodes, "ranks": world, "transport": transport, "first_verdict_s": first_s,
            "launches": len(source.launches),
            "first_cpu_s": first_cpu, "cpu_cores": steady_cpu / wall, "poll_cpu_s": sorted(poll_cpu)[len(poll_cpu) // 2],
            "bytes_per_node_poll": (stats["bytes"] - bytes0) / max(1, answers), "answers": answers,
            "bundles_s": bundles_s, "bundles": len(got), "silent": len(quiet), "arrived_s": arrived[0] if arrived else None}


def _when_all_arrived(source: StreamSource, expected: int, started: float) -> list[float]:
    """Seconds until ``expected`` bundles are in (read off the source while it collects)."""
    seen: list[float] = []

    def watch() -> None:
        while not seen and time.monotonic() - started < 120:
            if sum(1 for got in list(source._incoming.values()) if got.done) >= expected:
                seen.append(time.monotonic() - started)
            time.sleep(0.02)

    threading.Thread(target=watch, daemon=True).start()
    return seen


def _archive(kib: int) -> bytes:
    """A node's bundle: a .tar.gz of ``kib`` KiB that does not compress (the worst case on the wire)."""
    buffer = io.BytesIO()
    data = random.Random(3).randbytes(kib * 1024)
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        info = tarfile.TarInfo("bundle/ranks/0/blob.bin")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def decode_merge(nodes: int, per_node: int) -> dict:
    """Decode + merge + judgement of every node's line, now (wire format) and the old way (full JSON)."""
    snaps = node_snapshots(nodes, per_node)
    world = nodes * per_node
    wire = [encode_line(s, s.job.host) for s in snaps]
    full = [s.to_json(indent=None) for s in snaps]
    now_s = now_cpu = float("inf")
    for _ in range(3):  # best of three: the machine may be shared
        started, cpu = time.perf_counter(), time.process_time()
        views = [NodeView(a.node, a.snapshot) for a in map(decode_line, wire)]
        merged = merge_nodes(views, world_size=world)
        now_s, now_cpu = min(now_s, time.perf_counter() - started), min(now_cpu, time.process_time() - cpu)
    assert merged.verdict.culprits == (world - 1,), merged.verdict
    started = time.perf_counter()
    views = [NodeView(s.job.host, s) for s in map(Snapshot.from_json, full)]
    old = merge_nodes(views, world_size=world)
    old_s = time.perf_counter() - started
    assert old.verdict.culprits == merged.verdict.culprits and old.groups == merged.groups
    return {"ranks": world, "now_s": now_s, "now_cpu_s": now_cpu, "full_json_s": old_s,
            "wire_bytes_per_node": sum(map(len, wire)) / nodes, "json_bytes_per_node": sum(map(len, full)) / nodes}


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _raise_nofile(needed: int) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < needed:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(needed, hard), hard))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, default=1024)
    parser.add_argument("--per-node", type=int, default=PER_NODE)
    parser.add_argument("--transport", choices=("slurm", "ssh", "ssh-direct", "all"), default="all",
                        help="ssh: through relays (from RELAY_FROM hosts on); ssh-direct: one ssh per host")
    parser.add_argument("--window", type=float, default=2.0)
    parser.add_argument("--interval", type=float, default=2.0)
    parser.add_argument("--polls", type=int, default=5)
    parser.add_argument("--start", type=float, nargs=2, default=(0.5, 1.5), metavar=("MIN", "MAX"),
                        help="seconds from launch to an agent's hello (fan-out + interpreter start)")
    parser.add_argument("--jitter", type=float, default=0.3)
    parser.add_argument("--relay-start", type=float, nargs=2, default=(0.2, 0.6), metavar=("MIN", "MAX"),
                        help="seconds from launching a relay to it starting its agents (ssh to it, ~0.1 s start)")
    parser.add_argument("--relay-from", type=int, default=RELAY_FROM, help="ssh hosts from which relays are used")
    parser.add_argument("--bundle-kib", type=int, default=256, help="each node's bundle (.tar.gz), KiB")
    parser.add_argument("--silent", type=int, default=2, help="nodes that never send their bundle")
    parser.add_argument("--bundle-timeout", type=float, default=20.0, help="how long dump waits for bundles")
    parser.add_argument("--dump", type=float, nargs=2, default=(2.0, 7.0), metavar=("MIN", "MAX"),
                        help="seconds an agent takes to write its bundle")
    args = parser.parse_args(argv)
    transports = ("slurm", "ssh", "ssh-direct") if args.transport == "all" else (args.transport,)
    for transport in transports:
        r = fan_out(args.nodes, args.per_node, transport, args.window, args.interval, args.polls,
                    tuple(args.start), args.jitter, tuple(args.relay_start), args.relay_from, args.bundle_kib,
                    args.silent, args.bundle_timeout, tuple(args.dump))
        goal = args.window + 2.0
        relayed = transport == "ssh" and args.nodes >= args.relay_from > 0
        # the slowest replayed node's first answer: a whole window after its hello, or once called
        # for (FIRST_CALL_S after a window), after at least MIN_FIRST_LOOK of it
        hello = (args.relay_start[1] if relayed else 0.0) + args.start[1]
        called = max(args.window + FIRST_CALL_S, hello + MIN_FIRST_LOOK * args.window)
        floor = min(hello + args.window, called) + args.jitter
        waves = transport == "ssh-direct" and args.nodes > STREAM_START_PARALLEL
        slowest = (f"agents start in waves of {STREAM_START_PARALLEL}, each {args.start[0]:g}-{args.start[1]:g}s"
                   if waves else f"the slowest node answers by {floor:.1f}s")
        print(f"{r['nodes']} nodes x {args.per_node} ranks over {transport} ({r['launches']} launches): "
              f"first complete verdict after "
              f"{r['first_verdict_s']:.2f}s (goal window + 2 s = {goal:.1f}s: {'met' if r['first_verdict_s'] <= goal else 'missed'}; "
              f"{slowest}); "
              f"viewer CPU {100 * r['cpu_cores']:.0f}% of a core ({r['poll_cpu_s'] * 1000:.0f} ms per poll; "
              f"goal < 50%); {r['bytes_per_node_poll'] / 1024:.1f} KiB per node per poll; bundles of "
              f"{args.bundle_kib} KiB from {r['bundles']} nodes: all in after "
              f"{r['arrived_s'] or float('nan'):.1f}s, the dump done in {r['bundles_s']:.1f}s ({r['silent']} that never "
              f"sent theirs named at the {args.bundle_timeout:g}s timeout; goal 30 s)")
    d = decode_merge(args.nodes, args.per_node)
    print(f"decode + merge + judgement at {d['ranks']} ranks: {d['now_s']:.3f}s ({d['now_cpu_s']:.3f}s CPU) "
          f"with the wire format "
          f"({d['wire_bytes_per_node'] / 1024:.1f} KiB/node), {d['full_json_s']:.3f}s from full snapshot JSON "
          f"({d['json_bytes_per_node'] / 1024:.1f} KiB/node); before issue 16: {BEFORE_8192_S:.1f}s at 8192 ranks")
    return 0


if __name__ == "__main__":
    sys.exit(main())
