"""Starting runs: one experiment on the in-process or batched runtime (`run_experiment`), or a sweep of them.
The layer above the runtimes: core <- algorithms <- engine <- runtimes <- launch <- cli."""
