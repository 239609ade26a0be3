"""One run from config to finished run directory: the training loop, its checkpoints and the cached supervised warm-up."""
