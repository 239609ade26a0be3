"""Pure maths of RL fine-tuning: advantage estimators, policy losses, KL estimators, aggregations, filters, the objective and named presets. Imports nothing of this project."""
