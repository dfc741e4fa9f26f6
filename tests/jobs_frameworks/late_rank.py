"""A torchrun job whose last rank never reaches ``init_process_group``: it blocks in
``load_config``, reading a reply that never comes (a socket it opened itself, as a download from a
server that stopped answering), while the other ranks wait for it in the rendezvous. With
``--join-after S`` it gets its reply after S seconds and the job trains (gloo all_reduce). Truth:
``rendezvous``, the last rank named, in load_config.
"""

import os
import socket
import time

from _jobkit import log, rank, start


def load_config(late: bool, join_after: float | None) -> dict:
    if late:
        server = socket.create_server(("127.0.0.1", 0))
        reader = socket.create_connection(server.getsockname())
        peer, _ = server.accept()
        log(f"reading config pid {os.getpid()}")
        if join_after is not None:
            reader.settimeout(join_after)
        try:
            reader.recv(1)  # nothing is ever sent: blocks here
        except TimeoutError:
            pass
        peer.close()
    return {"lr": 0.1}


def main() -> None:
    args = start(__doc__, flags=())
    import torch
    import torch.distributed as dist

    world = int(os.environ["WORLD_SIZE"])
    join_after = float(os.environ["TW_JOIN_AFTER"]) if os.environ.get("TW_JOIN_AFTER") else None
    load_config(rank() == world - 1, join_after)
    dist.init_process_group("gloo")
    log("joined")
    tensor = torch.ones(8)
    while time.time() < args.stop_at:
        dist.all_reduce(tensor)
        time.sleep(0.05)


if __name__ == "__main__":
    main()
