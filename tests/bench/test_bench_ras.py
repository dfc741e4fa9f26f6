"""bench_ras at a small size: the figures it prints are about the right things (never timing)."""

import bench_ras


def test_bench_ras_small_runs_and_finds_the_straggler():
    results = bench_ras.main(small=True)
    polls = {(row["fixture"], row["format"]): row for row in results["polls"]}
    assert set(polls) >= {("straggler", "json"), ("straggler", "text"), ("dead", "json"), ("dead", "text")}
    sent = len("CLIENT PROTOCOL 2\nTIMEOUT 5\nSET FORMAT json\nVERBOSE STATUS\n")
    assert all(row["received"] > 0 and row["sent"] == sent for row in polls.values())
    scaled = results["scaled"]
    assert (scaled["ranks"], scaled["comms"]) == (64, 2)
    assert scaled["finding"].startswith("rank 61 (10.1.0.7, pid 10061) is 1 collective behind in communicator 0")
