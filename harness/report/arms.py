"""Study arms: which arm a run belongs to, and the arm's display name.

An arm is the algorithm name; ``<name>_iter`` for an algorithm run with ``algorithm.ref_reset_every > 0``
(GRPO with reference resets is ``grpo_iter``); off-policy training adds ``_k<k>`` for ``train.staleness``
k > 0 and ``_<correction>`` for an ``algorithm.correction`` other than none (``grpo_k8_token_tis``); LoRA
adapters add ``_lora`` (``dr_grpo_lora``; full fine-tuning of the same model is the plain name); a learned
reward model adds ``_<type>`` (``grpo_ps_prm``) and, for iterative RL with R > 1 rounds, ``_r<R>``
(``grpo_ps_prm_r4``); PRIME's own implicit PRM adds nothing. Both reports group by it: the study its arms,
the plain report its learning-rate selection (one winner per arm, never one across LoRA and full fine-tuning).
"""
from __future__ import annotations

from algorithms.presets import DISPLAY_NAMES
from harness.rundir.read import RunData, is_number

RM_NAMES = {"prm": "learned PRM", "orm": "learned ORM", "implicit": "implicit PRM"}
CORRECTION_NAMES = {"token_tis": "token-level TIS", "token_mask": "token-level mask", "seq_tis": "sequence-level TIS",
                    "seq_mask": "sequence-level mask"}
"""The off-policy corrections other than none (`algorithms.presets.CORRECTIONS`) as reports name them."""


def arm_of(run: RunData) -> str:
    """The study arm of a run (see the module doc)."""
    return arm_for(run.algorithm, run.config)


def arm_for(algorithm: str, config: dict) -> str:
    """The study arm of a run of ``algorithm`` with ``config`` (a config as a dict)."""
    if algorithm.endswith("_iter"):
        arm = algorithm
    else:
        alg = config.get("algorithm")
        reset = alg.get("ref_reset_every") if isinstance(alg, dict) else None
        arm = f"{algorithm}_iter" if is_number(reset) and reset > 0 else algorithm
    train, alg, model = (config.get(k) if isinstance(config.get(k), dict) else {}
                         for k in ("train", "algorithm", "model"))
    k = train.get("staleness")
    if is_number(k) and k > 0:
        arm += f"_k{int(k)}"
    if alg.get("correction") in CORRECTION_NAMES:
        arm += f"_{alg['correction']}"
    lora = model.get("lora")
    if isinstance(lora, dict) and is_number(lora.get("rank")) and lora["rank"] > 0:
        arm += "_lora"
    rm = config.get("reward_model")
    rm = rm if isinstance(rm, dict) else {}
    kind, rounds = rm.get("type"), rm.get("rounds")
    if isinstance(kind, str) and kind and not (algorithm == "prime" and kind == "implicit"):
        arm += f"_{kind}"
        if kind in ("orm", "prm") and is_number(rounds) and rounds > 1:
            arm += f"_r{int(rounds)}"
    return arm


def arm_name(arm: str) -> str:
    """The display name of an arm: the preset's (`algorithms.presets.DISPLAY_NAMES`), with its
    reward model and rounds."""
    if arm in DISPLAY_NAMES:
        return DISPLAY_NAMES[arm]
    parts = arm.split("_")
    rounds = parts.pop()[1:] if len(parts) > 1 and parts[-1].startswith("r") and parts[-1][1:].isdigit() else None
    kind = parts.pop() if len(parts) > 1 and parts[-1] in RM_NAMES else None
    lora = len(parts) > 1 and parts[-1] == "lora"
    if lora:
        parts.pop()
    correction = next((c for c in CORRECTION_NAMES if len(parts) > 2 and "_".join(parts[-2:]) == c), None)
    if correction:
        del parts[-2:]
    k = parts.pop()[1:] if len(parts) > 1 and parts[-1].startswith("k") and parts[-1][1:].isdigit() else None
    base = "_".join(parts)
    name = DISPLAY_NAMES.get(base, base)
    if k:
        name += f", staleness {k}"
    if correction:
        name += f", {CORRECTION_NAMES[correction]}"
    if lora:
        name += ", LoRA"
    if kind:
        name += f" + {RM_NAMES[kind]}"
    if rounds:
        name += f", {rounds} rounds"
    return name
