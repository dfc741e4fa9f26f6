"""One module per ``trainwatch`` subcommand; each exposes ``register(subparsers)``."""

COMMANDS = ("snapshot", "attach", "demo", "dump", "open", "run", "watch", "agent", "relay")
