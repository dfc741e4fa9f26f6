"""What is read of the ranks' stacks: py-spy dumps, sampled in parallel and bounded, the text shapes
of stacks other tools wrote (faulthandler, tracebacks), and the source lines frames point at."""
