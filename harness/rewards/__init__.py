"""Reward models: learned outcome and process reward models, PRIME's implicit PRM, their training command and iterative RL."""
