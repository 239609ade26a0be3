"""Named algorithms as compositions of registered parts (DeepSeekMath §4-5, arXiv 2402.03300).

``resolve(section)`` fills every component an ``algorithm`` config section left null from the
preset of its ``name`` and checks every name against its registry, so a typo fails before a run
starts, with the valid names listed. The config loader calls it once per config
(``harness.config.fields.Config.algo``, the resolved section); ``has_critic`` and
``uses_reference`` say which models a resolved algorithm trains with. :func:`algorithm_problem` is
the one check of an algorithm's name (the config's ``algorithm.name``, a sweep file's algorithms).
"""
from __future__ import annotations

import dataclasses
import difflib
import importlib
import reprlib
from typing import Any, Optional

from algorithms.registry import UnknownComponentError

_GRPO = dict(advantage="grpo", policy_loss="ppo_clip", aggregation="seq-mean-token-mean", reward="outcome",
             filter="none", kl_coef=0.04, kl_estimator="k3", kl_placement="loss", whiten_advantages=False,
             critic=False)
_RFT = dict(advantage="ones", policy_loss="sft_nll", aggregation="seq-mean-token-mean", reward="outcome",
            filter="correct", kl_coef=0.0, kl_estimator="k3", kl_placement="none", whiten_advantages=False,
            critic=False)

ALGORITHMS: dict[str, dict] = {
    # GRPO with outcome supervision (DeepSeekMath §4.1.2)
    "grpo": dict(_GRPO),
    # GRPO with process supervision (§4.1.3): step rewards, cumulative normalised advantages
    "grpo_ps": dict(_GRPO, advantage="grpo_ps", reward="process"),
    # GRPO with reference resets ONLY (not the paper's iterative RL): GRPO whose reference model is
    # replaced by the current policy every algorithm.ref_reset_every steps (required > 0). DeepSeekMath
    # §4.2's iterative RL also retrains a learned reward model on the policy's relabelled samples each
    # round: that is reward_model.type=orm|prm with reward_model.rounds > 1 (harness/rewards/run.py).
    # The key stays grpo_iter so committed results keep their run ids.
    "grpo_iter": dict(_GRPO),
    # Dr. GRPO (Liu et al., 2025): no std division, constant normaliser
    "dr_grpo": dict(_GRPO, advantage="dr_grpo", aggregation="seq-mean-token-sum-norm"),
    # RLOO (Ahmadian et al., 2024): leave-one-out baseline
    "rloo": dict(_GRPO, advantage="rloo"),
    # PRIME (Cui et al., 2025): RLOO on the outcome plus leave-one-out-baselined process returns; with
    # reward_model.type=implicit the process rewards are the implicit PRM's per-token log-ratios
    "prime": dict(_GRPO, advantage="prime", reward="process"),
    # GRPO with token-mean aggregation (DAPO-style)
    "grpo_token_mean": dict(_GRPO, aggregation="token-mean"),
    # PPO with a learned critic (§4.1.1): GAE, per-token k1 KL penalty in the reward, GAE advantages
    # whitened over the batch (masked mean / unbiased std, as verl and TRL)
    "ppo": dict(advantage="gae", policy_loss="ppo_clip", aggregation="seq-mean-token-mean", reward="outcome",
                filter="none", kl_coef=0.04, kl_estimator="k1", kl_placement="reward", whiten_advantages=True,
                critic=True),
    # Online RFT (§5.2.1): SFT on every correct sample the policy drew (gradient coefficient I(o) = 1,
    # duplicates included), normalised by the number of sampled outputs; no reference model
    "rft": dict(_RFT),
    # RFT variant: each distinct correct text of a group once (Yuan et al., 2023), same normaliser
    "rft_dedup": dict(_RFT, filter="correct_dedup"),
    # GSPO (Zheng et al., 2025, arXiv 2507.18071 eq. 5-7): GRPO's group advantage with the sequence ratio
    # s_i = (pi(y_i) / pi_old(y_i)) ** (1 / |y_i|) clipped per sequence at the paper's eps 3e-4 / 4e-4,
    # averaged over the group's sequences; no KL term (beta = 0: no reference model is loaded)
    "gspo": dict(_GRPO, ratio_level="sequence", eps_low=3e-4, eps_high=4e-4, kl_coef=0.0, kl_placement="none"),
    # REINFORCE++ (Hu, arXiv 2501.03262 eq. 8-10): no critic; A_t = outcome - beta * (k1 KL of the sampling
    # policy to the reference, summed from t), whitened over the global batch; PPO's clipped loss. beta:
    # the paper leaves it to the run; 0.04 is the ppo preset's, so the two differ only in the critic and
    # the normalisation
    "reinforce_pp": dict(_GRPO, advantage="reinforce_pp", kl_estimator="k1", kl_placement="reward",
                         whiten_advantages=True),
    # REINFORCE++-baseline (same paper, for groups): the group's mean reward subtracted before the above
    "reinforce_pp_baseline": dict(_GRPO, advantage="reinforce_pp_baseline", kl_estimator="k1",
                                  kl_placement="reward", whiten_advantages=True),
    # Lite PPO (Liu et al., arXiv 2508.08221): group-mean advantages scaled by the batch's reward std, and
    # token-level aggregation, on the critic-free clipped loss; no KL term (the paper's recipe names none)
    "lite_ppo": dict(_GRPO, advantage="lite_ppo", aggregation="token-mean", kl_coef=0.0, kl_placement="none"),
    # DAPO (Yu et al., arXiv 2503.14476): clip-higher (eps_low 0.2 / eps_high 0.28, eq. 10), dynamic sampling
    # (groups whose rewards are all equal are dropped and the stage draws again, up to 2 more batches: the
    # 3:1 of verl's recipe, gen_batch_size 1536 for train_batch_size 512), token-level loss, the soft
    # overlong punishment (eq. 13) over the last 20% of sampling.max_new_tokens (the paper's 4,096 of
    # 20,480), factor 1; no KL term
    "dapo": dict(_GRPO, aggregation="token-mean", eps_low=0.2, eps_high=0.28, kl_coef=0.0, kl_placement="none",
                 drop_zero_variance=True, max_resample=2, overlong_buffer=0.2, overlong_penalty=1.0),
    # CISPO (MiniMax-M1, arXiv 2506.13585 eq. 4-5): the clipped importance weight, under a stop-gradient,
    # on a REINFORCE term, token-mean; group advantage, no KL term. The paper sets no lower bound
    # (eps_low 1: the weight is clipped at 0, and a ratio is > 0) and does not publish its eps_high:
    # 0.28 is Trinity-RFT's CISPO default (and DAPO's clip-higher)
    "cispo": dict(_GRPO, policy_loss="cispo", aggregation="token-mean", eps_low=1.0, eps_high=0.28, kl_coef=0.0,
                  kl_placement="none"),
}

PRESET_DEFAULTS = dict(eps_low=None, eps_high=None, ratio_level="token", drop_zero_variance=False, max_resample=0,
                       overlong_mask=False, overlong_buffer=0.0, overlong_penalty=1.0)
"""The settings of a preset that does not name them: the clip range is ``clip_eps`` on both sides
(None: the section's ``clip_eps``), the ratio per token (PPO, GRPO); no group dropped, no
resampling, no overlong masking or penalty (what every run computed before these settings)."""
for _preset in ALGORITHMS.values():
    for _k, _v in PRESET_DEFAULTS.items():
        _preset.setdefault(_k, _v)

DISPLAY_NAMES: dict[str, str] = {
    "grpo": "GRPO (outcome supervision)", "grpo_ps": "GRPO (process supervision)", "grpo_iter": "GRPO + reference resets",
    "dr_grpo": "Dr. GRPO", "rloo": "RLOO", "ppo": "PPO", "rft": "online RFT", "gspo": "GSPO",
    "cispo": "CISPO", "reinforce_pp": "REINFORCE++", "reinforce_pp_baseline": "REINFORCE++-baseline",
    "lite_ppo": "Lite PPO", "dapo": "DAPO",
}
"""How reports name a preset to people (a preset without an entry is shown by its name)."""

REWARDS = ("outcome", "process")
# estimators whose baseline comes from the other samples of the same prompt
GROUP_ESTIMATORS = ("grpo", "grpo_ps", "grpo_ps_zerosum", "dr_grpo", "rloo", "prime", "reinforce_pp_baseline",
                    "lite_ppo")
COMPONENTS = ("advantage", "policy_loss", "aggregation", "reward", "filter", "kl_coef", "kl_estimator",
              "kl_placement", "whiten_advantages", "eps_low", "eps_high", "ratio_level", "drop_zero_variance",
              "max_resample", "overlong_mask", "overlong_buffer", "overlong_penalty")
RATIO_LEVELS = ("token", "sequence")
CORRECTIONS = ("none", "token_tis", "token_mask", "seq_tis", "seq_mask")
"""Off-policy corrections of the behaviour/proximal mismatch (``algorithm.correction``; registered in
``algorithms.corrections``, which imports torch: the names are here for the config's rule)."""
"""Where the importance ratio lives: per token (PPO, GRPO) or per sequence (GSPO, arXiv 2507.18071)."""


# where each component kind is registered; loaded only to check a component a config names
# beside its preset's, so reading a config (`harness config`, `--help`) does not import torch
REGISTRIES = {
    "advantage": ("algorithms.advantages", "ADVANTAGES"),
    "policy_loss": ("algorithms.losses", "POLICY_LOSSES"),
    "aggregation": ("algorithms.losses", "AGGREGATIONS"),
    "filter": ("algorithms.filters", "FILTERS"),
    "kl_estimator": ("algorithms.losses", "KL_ESTIMATORS"),
}
KL_PLACEMENTS = ("loss", "reward", "none")


def algorithm_problem(name: Any) -> Optional[str]:
    """Why ``name`` names no algorithm of :data:`ALGORITHMS` (None when it names one), with the
    closest names and the valid ones: ``unknown algorithm 'ppo2'; did you mean 'ppo'? (valid: ...)``."""
    if isinstance(name, str) and name in ALGORITHMS:
        return None
    text = str(name) if isinstance(name, (str, int, float)) else ""
    close = difflib.get_close_matches(text, list(ALGORITHMS), n=3, cutoff=0.5) if 0 < len(text) <= 200 else []
    hint = f"; did you mean {', '.join(repr(c) for c in close)}?" if close else ""
    return f"unknown algorithm {reprlib.repr(name)}{hint} (valid: {', '.join(ALGORITHMS)})"


def resolve(acfg):
    """``acfg`` (a frozen dataclass with ``name`` and the ``COMPONENTS`` fields: the config's
    ``algorithm`` section) with every component it left null set to the preset's value, each name
    checked against its registry (``UnknownComponentError`` listing the valid ones): a copy of the
    same type, every other field as given. A resolved section resolves to an equal one."""
    why = algorithm_problem(acfg.name)
    if why:
        raise UnknownComponentError(why)
    preset = ALGORITHMS[acfg.name]
    vals = {k: (getattr(acfg, k, None) if getattr(acfg, k, None) is not None else preset[k]) for k in COMPONENTS}
    for flag in ("whiten_advantages", "drop_zero_variance", "overlong_mask"):
        vals[flag] = bool(vals[flag])
    for side in ("eps_low", "eps_high"):  # neither given nor in the preset: the section's clip_eps
        vals[side] = float(acfg.clip_eps if vals[side] is None else vals[side])
    _check_loss_settings(vals)
    for kind, (module, registry) in REGISTRIES.items():
        if vals[kind] != preset[kind]:  # a preset's own components are registered (tests/algorithms checks)
            getattr(importlib.import_module(module), registry).get(vals[kind])
    if vals["kl_placement"] not in KL_PLACEMENTS:
        raise UnknownComponentError(f"unknown KL placement '{vals['kl_placement']}'; valid: {', '.join(KL_PLACEMENTS)}")
    if vals["reward"] not in REWARDS:
        raise UnknownComponentError(f"unknown reward '{vals['reward']}'; valid: {', '.join(REWARDS)}")
    return dataclasses.replace(acfg, **vals)


def _check_loss_settings(vals: dict) -> None:
    """The resolved clip range, ratio level and shaping settings hold their rules (a preset's values included)."""
    if not 0 < vals["eps_low"] <= 1:
        raise UnknownComponentError(f"eps_low={vals['eps_low']} is invalid: must be in (0, 1] "
                                    f"(1: no lower bound, the ratio is > 0)")
    if not vals["eps_high"] > 0:
        raise UnknownComponentError(f"eps_high={vals['eps_high']} is invalid: must be > 0")
    if not (isinstance(vals["max_resample"], int) and vals["max_resample"] >= 0):
        raise UnknownComponentError(f"max_resample={vals['max_resample']} is invalid: must be an integer >= 0")
    if not 0 <= vals["overlong_buffer"] < 1:
        raise UnknownComponentError(f"overlong_buffer={vals['overlong_buffer']} is invalid: must be in [0, 1)")
    if not vals["overlong_penalty"] >= 0:
        raise UnknownComponentError(f"overlong_penalty={vals['overlong_penalty']} is invalid: must be >= 0")
    if vals["ratio_level"] not in RATIO_LEVELS:
        raise UnknownComponentError(f"unknown ratio level '{vals['ratio_level']}'; valid: {', '.join(RATIO_LEVELS)}")


def has_critic(algo) -> bool:
    """Whether a resolved algorithm trains a critic: its preset has one, or its advantage is GAE."""
    return ALGORITHMS[algo.name]["critic"] or algo.advantage == "gae"


def uses_reference(algo) -> bool:
    """Whether a resolved algorithm holds a reference model: a KL term is on somewhere."""
    return algo.kl_placement != "none" and algo.kl_coef > 0
