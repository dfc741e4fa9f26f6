"""trainwatch.probes: everything that reads the world, and the pure analysis over it. No UI here."""
