"""The algorithm and reward_model sections of a run config: the RL algorithm as named parts, and a learned reward model in the loop.

A loaded config holds ``algorithm`` as given (components left null take the preset's) and
:attr:`harness.config.fields.Config.algo`, the section with the preset's components filled in.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from algorithms.presets import has_critic, uses_reference
from harness.config.base import check, check_choice
from harness.config.rules import dir_path_problem


@dataclass(frozen=True)
class AlgorithmConfig:
    name: str = "grpo"
    """Named algorithm; sets the defaults of every component below that is left null:
    grpo, grpo_ps (process supervision), grpo_iter (reference resets only; the paper's iterative RL with
    reward-model retraining is reward_model.rounds), dr_grpo, rloo, prime (RLOO + process returns; PRIME
    with reward_model.type=implicit), grpo_token_mean, ppo, rft, rft_dedup."""
    advantage: Optional[str] = None
    """Advantage estimator (registry in algorithms.advantages), e.g. grpo, grpo_ps, rloo, dr_grpo, gae."""
    policy_loss: Optional[str] = None
    """Per-token policy loss (algorithms.losses): ppo_clip or sft_nll."""
    aggregation: Optional[str] = None
    """How per-token losses become one number: seq-mean-token-mean (DeepSeekMath),
    token-mean, seq-mean-token-sum-norm (Dr. GRPO's constant normaliser)."""
    reward: Optional[str] = None
    """Reward signal: outcome (one score per completion) or process (one per step)."""
    filter: Optional[str] = None
    """Sample filter before the update: none; correct (online RFT: every correct output, alias
    correct_only); correct_dedup (each distinct correct text of a group once). Dropped rows have
    gradient coefficient 0: losses are still normalised by the whole sampled batch."""
    clip_eps: float = 0.2
    """epsilon of the clipped ratio min(r A, clip(r, 1-eps, 1+eps) A)."""
    kl_coef: Optional[float] = None
    """beta: KL weight (GRPO: 0.04 in the loss; PPO: 0.04 as a per-token reward penalty)."""
    kl_estimator: Optional[str] = None
    """KL estimator k1 (log ratio), k2 (half squared log ratio) or k3 (pi_ref/pi - log(pi_ref/pi) - 1)."""
    kl_placement: Optional[str] = None
    """Where the KL goes: loss, reward, or none (no reference model is held)."""
    std_eps: float = 1e-4
    """Added to the group standard deviation (see group_std) before dividing."""
    group_std: str = "population"
    """Std of GRPO's group normalisation (grpo, grpo_ps): population (ddof 0) or sample
    (ddof 1, larger by sqrt(G / (G - 1)))."""
    whiten_advantages: Optional[bool] = None
    """Whiten the advantages over the batch (masked mean, unbiased masked std, as verl's
    masked_whiten); null = the preset's (ppo: true, others false)."""
    prm: Optional[str] = None
    """Process rewards (reward: process): null = the task's rule-based step checker; a local
    directory = a neural process reward model (Math-Shepherd style, see evals.prm)."""
    ref_reset_every: int = 0
    """Reference resets: reset the reference model to the current policy every N steps (0 = never);
    grpo_iter requires N >= 1. (Iterative RL with a retrained reward model: reward_model.rounds.)"""
    gae_gamma: float = 1.0
    """PPO: discount of GAE."""
    gae_lambda: float = 0.95
    """PPO: lambda of GAE."""
    critic_lr: float = 3e-4
    """PPO: learning rate of the value model."""
    value_clip: float = 0.2
    """PPO: clip range of the clipped value loss (around the rollout-time values)."""
    value_coef: float = 0.5
    """PPO: weight of the value loss (the critic has its own optimizer; this scales its loss)."""
    critic_warmup_steps: int = 0
    """PPO: steps at the start that train only the critic (policy frozen)."""
    dr_grpo_norm: int = 0
    """Dr. GRPO: constant normaliser of the token sum (0 = sampling.max_new_tokens)."""

    def validate(self):
        check(self.clip_eps > 0, "algorithm.clip_eps", self.clip_eps, "must be > 0")
        check(self.kl_coef is None or self.kl_coef >= 0, "algorithm.kl_coef", self.kl_coef, "must be >= 0")
        check(self.std_eps >= 0, "algorithm.std_eps", self.std_eps, "must be >= 0")
        check_choice("algorithm.group_std", self.group_std, ("population", "sample"))
        check(self.ref_reset_every >= 0, "algorithm.ref_reset_every", self.ref_reset_every, "must be >= 0")
        check(0 <= self.gae_gamma <= 1, "algorithm.gae_gamma", self.gae_gamma, "must be in [0, 1]")
        check(0 <= self.gae_lambda <= 1, "algorithm.gae_lambda", self.gae_lambda, "must be in [0, 1]")
        check(self.critic_lr > 0, "algorithm.critic_lr", self.critic_lr, "must be > 0")
        check(self.value_clip > 0, "algorithm.value_clip", self.value_clip, "must be > 0")
        check(self.critic_warmup_steps >= 0, "algorithm.critic_warmup_steps", self.critic_warmup_steps, "must be >= 0")
        check(self.dr_grpo_norm >= 0, "algorithm.dr_grpo_norm", self.dr_grpo_norm, "must be >= 0")

    # of the resolved section (Config.algo), whose components are filled in
    @property
    def critic(self) -> bool:
        """Whether the algorithm trains a critic (its preset has one, or its advantage is gae)."""
        return has_critic(self)

    @property
    def uses_reference(self) -> bool:
        """Whether the algorithm holds a reference model (a KL term is on)."""
        return uses_reference(self)


REWARD_MODEL_TYPES = ("orm", "prm", "implicit")


@dataclass(frozen=True)
class RewardModelConfig:
    """A learned reward model in the loop (docs/reward_models.md). Left at its defaults the
    section changes nothing and does not enter the run id (harness.rundir.ids)."""

    type: Optional[str] = None
    """null: rewards from the task's exact checker (and algorithm.prm), as always. orm: a learned
    outcome reward model (P(good) at a tag after the completion) gives the outcome reward. prm: a
    learned Math-Shepherd-style process reward model (P(good) at a tag after each step) gives the
    step rewards (algorithms with reward: process). implicit: PRIME's implicit PRM (Cui et al. 2025),
    a copy of the starting policy trained online on every batch's outcome labels, whose per-token
    beta*log(pi_rm/pi_ref) are the process rewards (algorithm prime or grpo_ps). orm and prm are
    trained on the policy's own samples labelled by the exact checker (the grader for outcomes)."""
    init: Optional[str] = None
    """orm/prm: a folder written by `harness rm train` to start from (its recorded cost in samples,
    tokens and seconds is charged to this run's budget); null: one is trained before RL on
    samples_per_round samples of the starting policy."""
    rounds: int = 1
    """orm/prm: rounds of iterative RL (DeepSeekMath §4.2). 1: the reward model stays fixed during RL.
    R > 1: the budget is cut into R equal parts; at the end of each but the last the current policy
    draws samples_per_round samples, the exact checker labels them, the reward model trains further
    on them plus a replay of earlier examples, and the reference is reset to the policy."""
    samples_per_round: int = 1024
    """Completions drawn from the current policy to (re)train the reward model each round (a
    multiple of sampling.samples_per_prompt). They count against the run's budget (samples,
    tokens), as does the reward model's training time (seconds)."""
    replay_fraction: float = 0.1
    """Share of the earlier rounds' examples replayed when the reward model trains further
    (drawn without replacement, the count rounded half up; DeepSeekMath: 10%)."""
    epochs: int = 4
    """orm/prm: passes over each round's training set."""
    lr: float = 1e-3
    """Learning rate of the reward model (AdamW, constant). The defaults (lr 1e-3, 4 epochs, micro-batch
    32) suit the tiny model: a PRM trained so on 2,048 samples of the quickstart's warm-up scored
    held-out steps at AUC 0.83 (lr 1e-4 with 2 epochs on 512 samples: 0.52; docs/reward_models.md)."""
    micro_batch_size: int = 32
    """Sequences per reward-model forward / backward (one optimizer step per micro-batch for
    orm/prm; one per batch of rollouts for implicit)."""
    beta: float = 0.05
    """implicit: beta of the implicit PRM (PRIME: 0.05): token process reward beta*log(pi_rm/pi_ref),
    outcome logit beta times their sum."""

    def validate(self):
        if self.type is not None:
            check_choice("reward_model.type", self.type, REWARD_MODEL_TYPES)
        check(self.rounds >= 1, "reward_model.rounds", self.rounds, "must be >= 1 (1 = one round, no retraining)")
        check(self.samples_per_round >= 1, "reward_model.samples_per_round", self.samples_per_round, "must be >= 1")
        check(0.0 <= self.replay_fraction <= 1.0, "reward_model.replay_fraction", self.replay_fraction,
              "must be in [0, 1]")
        check(self.epochs >= 1, "reward_model.epochs", self.epochs, "must be >= 1")
        check(self.lr > 0, "reward_model.lr", self.lr, "must be > 0")
        check(self.micro_batch_size >= 1, "reward_model.micro_batch_size", self.micro_batch_size, "must be >= 1")
        check(self.beta > 0, "reward_model.beta", self.beta, "must be > 0")
        if self.init is not None:
            why = dir_path_problem(self.init)
            check(why is None, "reward_model.init", self.init, f"{why} (a folder written by `harness rm train`)")
