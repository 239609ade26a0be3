"""The algorithm and reward_model sections of a run config: the RL algorithm as named parts, and a learned reward model in the loop.

A loaded config holds ``algorithm`` as given (components left null take the preset's) and
:attr:`harness.config.fields.Config.algo`, the section with the preset's components filled in.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Optional

from algorithms.presets import CORRECTIONS, RATIO_LEVELS, has_critic, uses_reference
from harness.config.rules import (ALGORITHM, FRACTION, MAX_EVAL_POINTS, POSITIVE_FRACTION, STAGE_SAMPLES, above,
                                  at_least, at_most, between, check_fields, dir_path, one_of, rule, ruled)

MAX_RESAMPLE = 100
"""Most further draws dynamic sampling makes in one stage (verl's max_num_gen_batches defaults to 10)."""


@dataclass(frozen=True)
class AlgorithmConfig:
    name: str = ruled("grpo", ALGORITHM)
    """Named algorithm; sets the defaults of every component below that is left null:
    grpo, grpo_ps (process supervision), grpo_iter (reference resets only; the paper's iterative RL with
    reward-model retraining is reward_model.rounds), dr_grpo, rloo, prime (RLOO + process returns; PRIME
    with reward_model.type=implicit), grpo_token_mean, ppo, rft, rft_dedup, gspo (sequence ratio), cispo (clipped IS weight), reinforce_pp and reinforce_pp_baseline
    (REINFORCE++), lite_ppo, dapo."""
    advantage: Optional[str] = None
    """Advantage estimator (registry in algorithms.advantages), e.g. grpo, grpo_ps, rloo, dr_grpo, gae,
    reinforce_pp, reinforce_pp_baseline, lite_ppo (group mean, batch std)."""
    policy_loss: Optional[str] = None
    """Policy loss (algorithms.losses): ppo_clip, cispo or sft_nll."""
    aggregation: Optional[str] = None
    """How per-token losses become one number: seq-mean-token-mean (DeepSeekMath),
    token-mean, seq-mean-token-sum-norm (Dr. GRPO's constant normaliser)."""
    reward: Optional[str] = None
    """Reward signal: outcome (one score per completion) or process (one per step)."""
    filter: Optional[str] = None
    """Sample filter before the update: none; correct (online RFT: every correct output, alias
    correct_only); correct_dedup (each distinct correct text of a group once). Dropped rows have
    gradient coefficient 0: losses are still normalised by the whole sampled batch."""
    clip_eps: float = ruled(0.2, above(0))
    """epsilon of the clipped ratio min(r A, clip(r, 1-eps, 1+eps) A): both sides of the range where
    eps_low / eps_high and the preset leave them null."""
    eps_low: Optional[float] = ruled(None, POSITIVE_FRACTION)
    """Lower side of the clip range, clip(r, 1 - eps_low, 1 + eps_high); null = the preset's, else
    clip_eps (dapo 0.2; gspo 3e-4; cispo 1.0, no lower bound on its importance weight)."""
    eps_high: Optional[float] = ruled(None, above(0))
    """Upper side of the clip range; null = the preset's, else clip_eps (DAPO's clip-higher 0.28,
    arXiv 2503.14476; gspo 4e-4, arXiv 2507.18071)."""
    ratio_level: Optional[str] = ruled(None, one_of(RATIO_LEVELS))
    """Importance ratio per token (PPO, GRPO) or per sequence (GSPO: exp of the mean log-ratio over
    the completion's tokens); null = the preset's (token but for gspo)."""
    drop_zero_variance: Optional[bool] = None
    """Drop the groups whose rewards are all equal (zero advantage) before the update, so the loss is
    normalised over the informative ones; null = the preset's (dapo: true). Their samples still count
    against the budget (samples_drawn vs samples_used in metrics.jsonl and summary.json)."""
    max_resample: Optional[int] = ruled(None, between(0, MAX_RESAMPLE))
    """DAPO's dynamic sampling: with drop_zero_variance, draw up to this many more batches of prompts in a
    stage until it holds train.prompts_per_step informative groups (fewer if the bound or the budget is
    reached first); every sample drawn is charged to the budget; null = the preset's (dapo: 2, else 0). At most
    MAX_RESAMPLE: a policy whose groups are all uniform (all wrong, say) would otherwise draw without end under a
    steps budget."""
    overlong_mask: Optional[bool] = None
    """Overlong filtering (DAPO §3.4): truncated completions (no EOS within sampling.max_new_tokens) get
    gradient coefficient 0 (the loss is still normalised by the sampled batch); null = the preset's (false)."""
    overlong_buffer: Optional[float] = ruled(None, rule(lambda v: isinstance(v, (int, float)) and not isinstance(v, bool)
                                                        and 0 <= v < 1, "must be in [0, 1)"))
    """DAPO's soft overlong punishment (eq. 13): L_cache as a share of sampling.max_new_tokens (rounded to
    tokens); a completion longer than max_new_tokens - L_cache gets a reward penalty growing linearly
    to -overlong_penalty at max_new_tokens. 0 = off; null = the preset's (dapo: 0.2, the paper's 4,096
    of 20,480 tokens)."""
    overlong_penalty: Optional[float] = ruled(None, at_least(0))
    """Largest overlong penalty (verl's penalty_factor); null = the preset's (1.0)."""
    kl_coef: Optional[float] = ruled(None, at_least(0))
    """beta: KL weight (GRPO: 0.04 in the loss; PPO: 0.04 as a per-token reward penalty)."""
    kl_estimator: Optional[str] = None
    """KL estimator k1 (log ratio), k2 (half squared log ratio) or k3 (pi_ref/pi - log(pi_ref/pi) - 1)."""
    kl_placement: Optional[str] = None
    """Where the KL goes: loss, reward, or none (no reference model is held)."""
    std_eps: float = ruled(1e-4, at_least(0))
    """Added to the group standard deviation (see group_std) before dividing."""
    group_std: str = ruled("population", one_of(("population", "sample")))
    """Std of GRPO's group normalisation (grpo, grpo_ps): population (ddof 0) or sample
    (ddof 1, larger by sqrt(G / (G - 1)))."""
    whiten_advantages: Optional[bool] = None
    """Whiten the advantages over the batch (masked mean, unbiased masked std, as verl's
    masked_whiten); null = the preset's (ppo: true, others false)."""
    prm: Optional[str] = None
    """Process rewards (reward: process): null = the task's rule-based step checker; a local
    directory = a neural process reward model (Math-Shepherd style, see evals.prm)."""
    ref_reset_every: int = ruled(0, at_least(0))
    """Reference resets: reset the reference model to the current policy every N steps (0 = never);
    grpo_iter requires N >= 1. (Iterative RL with a retrained reward model: reward_model.rounds.)"""
    gae_gamma: float = ruled(1.0, FRACTION)
    """PPO: discount of GAE."""
    gae_lambda: float = ruled(0.95, FRACTION)
    """PPO: lambda of GAE."""
    critic_lr: float = ruled(3e-4, above(0))
    """PPO: learning rate of the value model."""
    value_clip: float = ruled(0.2, above(0))
    """PPO: clip range of the clipped value loss (around the rollout-time values)."""
    value_coef: float = 0.5
    """PPO: weight of the value loss (the critic has its own optimizer; this scales its loss)."""
    critic_warmup_steps: int = ruled(0, at_least(0))
    """PPO: steps at the start that train only the critic (policy frozen)."""
    dr_grpo_norm: int = ruled(0, at_least(0))
    """Dr. GRPO: constant normaliser of the token sum (0 = sampling.max_new_tokens)."""
    correction: str = ruled("none", one_of(CORRECTIONS))
    """Off-policy correction of the behaviour policy (the sampler's log-probs: older weights under
    train.staleness, another precision under sampling.dtype) against the proximal one (the learner's
    at the weights the update starts from), applied to every policy loss as a token weight on the
    advantage (algorithms.corrections): none; token_tis (min(rho_t, C)); token_mask (0 outside
    [1/C, C]); seq_tis / seq_mask (the same with the sequence's geometric-mean ratio). C:
    correction_cap. Any value but none also logs the offpolicy/* diagnostics every step."""
    correction_cap: float = ruled(2.0, rule(lambda v: isinstance(v, (int, float)) and not isinstance(v, bool)
                                            and v > 1, "must be > 1"))
    """C of algorithm.correction: the truncation cap, and the mask's range [1/C, C]."""

    OMITTED_AT_DEFAULT: ClassVar[tuple[str, ...]] = ("correction", "correction_cap")
    """Later settings left out of config.yaml and run ids at their defaults (earlier runs keep their ids)."""

    def validate(self):
        check_fields(self, "algorithm")

    # of the resolved section (Config.algo), whose components are filled in
    @property
    def critic(self) -> bool:
        """Whether the algorithm trains a critic (its preset has one, or its advantage is gae)."""
        return has_critic(self)

    @property
    def uses_reference(self) -> bool:
        """Whether the algorithm holds a reference model (a KL term is on)."""
        return uses_reference(self)


TRAINED_REWARD_MODELS = ("orm", "prm")
"""Reward models `harness rm train` trains and a folder's reward_model.json names (``kind``)."""
REWARD_MODEL_TYPES = TRAINED_REWARD_MODELS + ("implicit",)
"""``reward_model.type``: a trained one, or PRIME's implicit PRM (trained online inside a run)."""


@dataclass(frozen=True)
class RewardModelConfig:
    """A learned reward model in the loop (docs/reward_models.md). Left at its defaults the
    section changes nothing and does not enter the run id (harness.rundir.ids)."""

    type: Optional[str] = ruled(None, one_of(REWARD_MODEL_TYPES))
    """null: rewards from the task's exact checker (and algorithm.prm), as always. orm: a learned
    outcome reward model (P(good) at a tag after the completion) gives the outcome reward. prm: a
    learned Math-Shepherd-style process reward model (P(good) at a tag after each step) gives the
    step rewards (algorithms with reward: process). implicit: PRIME's implicit PRM (Cui et al. 2025),
    a copy of the starting policy trained online on every batch's outcome labels, whose per-token
    beta*log(pi_rm/pi_ref) are the process rewards (algorithm prime or grpo_ps). orm and prm are
    trained on the policy's own samples labelled by the exact checker (the grader for outcomes)."""
    init: Optional[str] = ruled(None, dir_path(" (a folder written by `harness rm train`)"))
    """orm/prm: a folder written by `harness rm train` to start from (its recorded cost in samples,
    tokens and seconds is charged to this run's budget); null: one is trained before RL on
    samples_per_round samples of the starting policy."""
    rounds: int = ruled(1, at_least(1, " (1 = one round, no retraining)"),
                        at_most(MAX_EVAL_POINTS, " (the round ends are a list of that many budget points, as "
                                                 "budget.eval_points; the budget's stages bound it further)"))
    """orm/prm: rounds of iterative RL (DeepSeekMath §4.2). 1: the reward model stays fixed during RL.
    R > 1: the budget is cut into R equal parts; at the end of each but the last the current policy
    draws samples_per_round samples, the exact checker labels them, the reward model trains further
    on them plus a replay of earlier examples, and the reference is reset to the policy."""
    samples_per_round: int = ruled(1024, STAGE_SAMPLES)
    """Completions drawn from the current policy to (re)train the reward model each round (a
    multiple of sampling.samples_per_prompt). They count against the run's budget (samples,
    tokens), as does the reward model's training time (seconds)."""
    replay_fraction: float = ruled(0.1, FRACTION)
    """Share of the earlier rounds' examples replayed when the reward model trains further
    (drawn without replacement, the count rounded half up; DeepSeekMath: 10%)."""
    epochs: int = ruled(4, at_least(1))
    """orm/prm: passes over each round's training set."""
    lr: float = ruled(1e-3, above(0))
    """Learning rate of the reward model (AdamW, constant). The defaults (lr 1e-3, 4 epochs, micro-batch
    32) suit the tiny model: a PRM trained so on 2,048 samples of the quickstart's warm-up scored
    held-out steps at AUC 0.83 (lr 1e-4 with 2 epochs on 512 samples: 0.52; docs/reward_models.md)."""
    micro_batch_size: int = ruled(32, at_least(1))
    """Sequences per reward-model forward / backward (one optimizer step per micro-batch for
    orm/prm; one per batch of rollouts for implicit)."""
    beta: float = ruled(0.05, above(0))
    """implicit: beta of the implicit PRM (PRIME: 0.05): token process reward beta*log(pi_rm/pi_ref),
    outcome logit beta times their sum."""

    def validate(self):
        check_fields(self, "reward_model")
