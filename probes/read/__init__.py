"""Reading the world: processes, /proc, py-spy, logs, the kernel log, NVML, Flight Recorder and armed ranks."""
