"""Jobs that span nodes: the ssh/srun/kubectl transports, host lists, and merging node snapshots."""
