"""What is read of logs: each rank's log (its tail, its growth, the reason it died), launchers' logs,
crash logs, the kernel log, and what a job left behind when it is gone."""
