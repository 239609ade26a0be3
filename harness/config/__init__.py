"""Run configuration: the frozen, documented dataclasses of a run (schema) and the strict YAML machinery under them (base); the shipped config files are data, in harness/configs/."""
