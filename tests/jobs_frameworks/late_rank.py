"""A torchrun job whose last rank never reaches ``init_process_group``: it blocks in
``load_config``, reading a reply that never comes (a socket it opened itself, as a download from a
server that stopped answering), while the other ranks wait for it in the rendezvous (every rank
exits at ``--deadline``). Truth: ``rendezvous``, the last rank named, in load_config.

With ``TW_GROUP=rank,world,port`` in its environment it is one process of a group started apart
(no launcher, as Ray starts its actors): it sets RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT in
``os.environ`` at run time, so its /proc/PID/environ holds none of them.
"""

import os
import socket
import time

from _jobkit import log, rank, start


def load_config(late: bool) -> dict:
    if late:
        server = socket.create_server(("127.0.0.1", 0))
        reader = socket.create_connection(server.getsockname())
        sender, _ = server.accept()  # held open, silent
        log(f"reading config pid {os.getpid()}")
        reader.recv(1)  # nothing is ever sent: blocks here
        sender.close()
    return {"lr": 0.1}


def join_at_run_time() -> None:
    group = os.environ.get("TW_GROUP")
    if group:
        number, world, port = group.split(",")
        os.environ.update({"RANK": number, "WORLD_SIZE": world, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port})


def main() -> None:
    args = start(__doc__)
    import torch
    import torch.distributed as dist

    join_at_run_time()
    world_size = int(os.environ["WORLD_SIZE"])
    load_config(rank() == world_size - 1)
    dist.init_process_group("gloo")
    log("joined")
    tensor = torch.ones(8)
    while time.time() < args.stop_at:
        dist.all_reduce(tensor)
        time.sleep(0.05)


if __name__ == "__main__":
    main()
