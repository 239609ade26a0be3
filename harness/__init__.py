"""grpo-harness: everything that runs (config, engine, training, run directories, sweeps, tracking, reports, CLI). Imports algorithms and evals; neither imports it."""
