"""What computes: models and tokenizers, the fast Llama forward, the sampler, the learner, evaluation with a sampler, multi-process wrappers and per-phase performance counters."""
