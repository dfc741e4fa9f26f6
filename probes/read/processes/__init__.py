"""What is read of the job's processes: the process tree and how a job is found in it (launchers,
Ray's records), /proc, the kernel's view of a thread, CPU use, exits and the kernel's exit events."""
