"""What is read of the collectives: the feed over every collective-state source (``sources/``:
Flight Recorder, NCCL RAS, watchdog lines), Flight Recorder traces, NCCL's state, RAS replies and
the armed ranks' hook."""
