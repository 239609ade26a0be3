"""Trackers that mirror a run's metrics.jsonl: the tracker protocol, MLflow, wandb, and replaying finished runs (sync) and the MLflow UI."""
