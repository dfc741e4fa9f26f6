"""Evidence that outlives the job: bundles, their summary, redaction, and the headless watcher that writes them."""
