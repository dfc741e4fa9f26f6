"""Defaults for reaching other nodes, in a module of their own so the command line can show them
without loading the remote machinery."""

DEFAULT_TIMEOUT_S = 30.0  # give up on a node after this long
DEFAULT_PARALLEL = 32  # nodes asked at once
