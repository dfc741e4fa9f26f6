"""`trainwatch relay`: one relay of a tree of node agents, started by a viewer over ssh (hidden).

It runs the agent on its own node and, over ssh, on the nodes named with ``--node``, and writes
their lines to stdout labelled with each agent's task number (0: its own). See
``trainwatch.probes.remote.relay``.
"""

from __future__ import annotations

import argparse
import shlex

from .common import positive_seconds


def register(sub: argparse._SubParsersAction) -> None:
    # No help=: argparse then leaves the command out of `trainwatch --help` (it is not for people).
    parser = sub.add_parser("relay", description="Relay of node agents started by a trainwatch viewer.")
    parser.add_argument("--self", dest="me", required=True, metavar="NAME", help="this node's name (task 0)")
    parser.add_argument("--node", action="append", default=[], metavar="NAME[=DESTINATION]",
                        help="another node, reached over ssh (tasks 1, 2, ... in this order)")
    parser.add_argument("--ssh", default="ssh", help="the ssh command")
    parser.add_argument("--ssh-arg", action="append", default=[], metavar="ARG", help="an argument for ssh")
    parser.add_argument("--connect-timeout", type=int, default=10, metavar="S")
    parser.add_argument("--remote-trainwatch", default="trainwatch", metavar="CMD")
    parser.add_argument("--timeout", type=positive_seconds, default=30.0, metavar="S")
    parser.add_argument("agent", nargs=argparse.REMAINDER, help="the agent's arguments, after --")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from ...probes import Child, SshRemote, run_relay

    agent = args.agent[1:] if args.agent[:1] == ["--"] else args.agent
    children = [Child(0, args.me, ["sh", "-c", f"exec {args.remote_trainwatch} {shlex.join(agent)}"], None)]
    for task, spec in enumerate(args.node, start=1):
        name, _, destination = spec.partition("=")
        remote = SshRemote(name, destination, tuple(args.ssh_arg), args.connect_timeout, args.ssh)
        children.append(Child(task, name, remote.stream_argv(args.remote_trainwatch, agent), remote))
    return run_relay(children, args.timeout)
