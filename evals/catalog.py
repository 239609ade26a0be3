"""Every task by name: imports the modules that register tasks, and builds one from its spec."""
from __future__ import annotations

import evals.arith  # noqa: F401  (registers arith)
import evals.datasets  # noqa: F401  (registers gsm8k, math, math500)
import evals.wordarith  # noqa: F401  (registers wordarith)
from evals.tasks import _REGISTRY, Task


def available_tasks() -> list[str]:
    return sorted(_REGISTRY)


_CLASSES = {"arith": evals.arith.ArithTask, "gsm8k": evals.datasets.GSM8KTask, "math": evals.datasets.MathTask,
            "math500": evals.datasets.Math500Task, "wordarith": evals.wordarith.WordArithTask}


def has_step_checker(name: str) -> bool:
    """Whether task ``name`` has a rule-based step checker (overrides ``Task.step_rewards``), so
    process-reward algorithms can run on it without a process reward model."""
    cls = _CLASSES.get(name)
    return cls is not None and cls.step_rewards is not Task.step_rewards


def get_task(cfg) -> Task:
    """Build the task named by ``cfg.name`` (a :class:`evals.tasks.TaskSpec` or the run config's task section)."""
    if cfg.name not in _REGISTRY:
        raise ValueError(f"unknown task '{cfg.name}'; available: {', '.join(sorted(_REGISTRY))}")
    return _REGISTRY[cfg.name](cfg)
