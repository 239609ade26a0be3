"""Refusals across sections of a run config: what the sections must agree on, the out-of-domain and long warm-up tasks derived from them, and the warnings of a valid config."""
from __future__ import annotations

import dataclasses
import math
from typing import Optional

from algorithms.presets import GROUP_ESTIMATORS, resolve
from algorithms.registry import UnknownComponentError
from evals.arith import describe_knobs, held_out_shortfall, problem_space
from evals.catalog import has_step_checker
from harness.config.rules import MAX_PER_STEP
from harness.foundation.base import ConfigError, check
from harness.foundation.budget import stage_samples, threshold_warning


def arith_prompt_tokens(task) -> int:
    """Upper bound on the tiny model's tokens for an arith prompt ``Q:<expr>\nA:`` (one
    character a token, plus BOS): operands of at most len(str(max_operand)) digits."""
    digits = max(len(str(task.max_operand)), len(str(task.min_operand)))
    return 1 + len("Q:\nA:") + (task.max_ops + 1) * digits + task.max_ops


def whole_groups_problem(n: int, group: int) -> Optional[str]:
    """Why ``n`` samples are not whole groups of ``group`` (sampling.samples_per_prompt), with the
    nearest counts that are (``reward_model.samples_per_round``, ``harness rm train --samples``); None
    when they are."""
    if n % group == 0:
        return None
    low, high = n // group * group, (n // group + 1) * group
    return (f"must be a multiple of sampling.samples_per_prompt ({group}): whole groups of the policy's samples "
            f"({n} would draw {high}); give " + (f"{low} or {high}" if low else f"{high}"))


def check_config(cfg) -> None:
    """What the sections of ``cfg`` must agree on (each section, and the top-level fields, kept their
    own rules): one ConfigError naming the field."""
    try:
        algo = cfg.algo
    except UnknownComponentError as e:
        raise ConfigError(f"algorithm: {e}") from None
    check(algo.advantage not in GROUP_ESTIMATORS or cfg.sampling.samples_per_prompt >= 2,
          "sampling.samples_per_prompt", cfg.sampling.samples_per_prompt,
          f"advantage '{algo.advantage}' normalises within a group of samples per prompt: G must be >= 2")
    check(cfg.train.prompts_per_step * cfg.sampling.samples_per_prompt <= MAX_PER_STEP,
          "train.prompts_per_step", cfg.train.prompts_per_step,
          f"prompts_per_step x sampling.samples_per_prompt must be <= {MAX_PER_STEP} samples per stage")
    if algo.reward == "process" and algo.prm in (None, "", "rule") and cfg.reward_model.type is None:
        check(has_step_checker(cfg.task.name), "algorithm.prm", algo.prm,
              f"algorithm '{algo.name}' uses process rewards, and task '{cfg.task.name}' has no "
              f"step checker: set algorithm.prm to a process reward model directory, reward_model.type to "
              f"implicit (PRIME), or use an outcome-reward algorithm")
    check(algo.name != "grpo_iter" or algo.ref_reset_every > 0, "algorithm.ref_reset_every", algo.ref_reset_every,
          "grpo_iter (GRPO with reference resets) resets its reference every N steps: set N >= 1")
    check(not (algo.drop_zero_variance and cfg.reward_model.type is not None), "algorithm.drop_zero_variance", True,
          f"dynamic sampling scores several draws a stage, and a learned reward model (reward_model.type="
          f"{cfg.reward_model.type}) scores one: set algorithm.drop_zero_variance=false")
    _check_pipeline(cfg, algo)
    _check_reward_model(cfg, algo)
    _check_lora(cfg, algo)
    ood = None
    if cfg.eval.ood.enabled:
        check(cfg.task.name == "arith", "eval.ood.enabled", True,
              f"the out-of-domain knobs are arith's; task '{cfg.task.name}' has none")
        ood = ood_task_spec(cfg)  # validates the changed knobs
    if cfg.eval.validation and cfg.task.name == "arith" and cfg.task.disjoint_validation:
        space = problem_space(cfg.task)
        check(space.validation >= 1 if space.exact else space.validation >= cfg.task.eval_size,
              "eval.validation", True,
              f"the validation set draws task.eval_size={cfg.task.eval_size} problems from the validation half "
              f"of the held-out bucket (task.disjoint_validation), and these arith knobs allow "
              f"{'about ' if not space.exact else ''}{space.validation:,}: lower task.eval_size or widen the "
              f"task (max_operand, operators, max_ops)")
    elif cfg.eval.validation and cfg.task.name == "arith":
        space = problem_space(cfg.task)
        check(space.heldout > cfg.task.eval_size if space.exact else space.heldout >= 2 * cfg.task.eval_size,
              "eval.validation", True,
              f"the validation split draws task.eval_size={cfg.task.eval_size} more held-out problems than "
              f"the test set's, and these arith knobs allow {'about ' if not space.exact else ''}"
              f"{space.heldout:,}: lower task.eval_size or widen the task (max_operand, operators, max_ops)")
    if cfg.warmup.enabled and cfg.warmup.long_share > 0:
        check(cfg.task.name == "arith", "warmup.long_share", cfg.warmup.long_share,
              f"adds longer arith solutions to the warm-up; task '{cfg.task.name}' has none: set it to 0")
        long = warmup_long_spec(cfg)
        check(problem_space(long).train > 0, "warmup.long_ops", cfg.warmup.long_ops,
              f"these arith knobs ({describe_knobs(long)}) leave no expression outside the held-out bucket "
              f"for the warm-up's longer solutions: change warmup.long_ops or widen the task")
    if cfg.model.name_or_path == "tiny" and cfg.task.name == "arith":
        tasks = [cfg.task] + ([ood] if ood is not None else [])
        prompt = max(arith_prompt_tokens(t) for t in tasks)
        new = max(cfg.sampling.max_new_tokens, cfg.eval.max_new_tokens)
        check(cfg.model.max_length >= prompt + new, "model.max_length", cfg.model.max_length,
              f"must hold the longest prompt ({prompt} tokens) + max_new_tokens ({new}) = {prompt + new}")

def _check_pipeline(cfg, algo) -> None:
    """A sampler apart from the learner (train.staleness >= 1, sampling.dtype) samples whole stages ahead:
    not dynamic sampling's extra draws, not a learned reward model's rounds."""
    if not (cfg.train.staleness or cfg.sampling.dtype):
        return
    field, value = ("train.staleness", cfg.train.staleness) if cfg.train.staleness else ("sampling.dtype",
                                                                                          cfg.sampling.dtype)
    check(not algo.drop_zero_variance, field, value,
          "the pipelined sampler draws each stage once; dynamic sampling (algorithm.drop_zero_variance) draws "
          "again within a stage: set one of them off")
    check(cfg.reward_model.type is None, field, value,
          f"the pipelined sampler is not wired to a learned reward model (reward_model.type="
          f"{cfg.reward_model.type}): remove one of them")
    check(not cfg.model.lora.enabled, field, value,
          "the pipelined sampler copies whole weights, not LoRA adapters (model.lora.rank > 0): not supported yet, "
          "set one of them off")


def _check_lora(cfg, algo) -> None:
    """LoRA (``model.lora.rank`` > 0) with what holds it up: the reference is the policy with its adapters off,
    so it cannot be reset to the policy; learned reward models copy the policy whole; the warm-up's Adam state is
    for every weight, not the adapters."""
    if not cfg.model.lora.enabled:
        return
    check(algo.ref_reset_every == 0, "algorithm.ref_reset_every", algo.ref_reset_every,
          "with LoRA (model.lora.rank > 0) the reference is the frozen base model and is never reset: set it to 0 "
          "or model.lora.rank=0")
    check(cfg.reward_model.type is None, "reward_model.type", cfg.reward_model.type,
          "learned reward models are not LoRA-aware yet: leave reward_model.type null with model.lora.rank > 0")
    check(not cfg.train.reuse_warmup_optimizer, "train.reuse_warmup_optimizer", True,
          "with LoRA only the adapters train: the warm-up's Adam state (for every weight) does not apply")


def _check_reward_model(cfg, algo) -> None:
    """The reward_model section fits the algorithm and the task (one ConfigError naming the field)."""
    rm = cfg.reward_model
    if rm.type is None:
        check(rm.rounds == 1, "reward_model.rounds", rm.rounds,
              "iterative RL retrains a learned reward model: set reward_model.type to orm or prm (reference "
              "resets alone are algorithm grpo_iter with algorithm.ref_reset_every)")
        check(rm.init is None, "reward_model.init", rm.init, "needs reward_model.type (orm or prm)")
        return
    wants = "outcome" if rm.type == "orm" else "process"
    check(algo.reward == wants, "reward_model.type", rm.type,
          f"gives {wants} rewards, and algorithm '{algo.name}' uses {algo.reward} rewards: use "
          + ("an outcome-reward algorithm (grpo, rloo, dr_grpo, ppo, ...)" if wants == "outcome"
             else "a process-reward algorithm (grpo_ps, prime)"))
    check(algo.prm in (None, "", "rule"), "algorithm.prm", algo.prm,
          f"reward_model.type={rm.type} supplies the rewards: leave algorithm.prm null")
    check(rm.type != "implicit" or (rm.rounds == 1 and rm.init is None), "reward_model.type", rm.type,
          "the implicit PRM trains online on every batch: reward_model.rounds and reward_model.init are for "
          "orm and prm")
    check(rm.rounds == 1 or algo.ref_reset_every == 0, "algorithm.ref_reset_every",
          algo.ref_reset_every, "iterative RL (reward_model.rounds > 1) resets the reference at the "
          "end of each round: leave algorithm.ref_reset_every at 0")
    why = whole_groups_problem(rm.samples_per_round, cfg.sampling.samples_per_prompt)
    check(why is None, "reward_model.samples_per_round", rm.samples_per_round, str(why))
    stages = budget_stages(cfg)
    check(stages is None or rm.rounds <= stages, "reward_model.rounds", rm.rounds,
          f"each round needs at least one training stage, and a budget of {cfg.budget.amount:g} {cfg.budget.unit} "
          f"holds {stages}: at most {stages} rounds (more would merge into fewer retrainings than asked)")
    trainings = (rm.rounds - 1 + (rm.init is None)) if rm.type != "implicit" else 0
    check(cfg.budget.unit != "samples" or rm.samples_per_round * trainings < cfg.budget.amount,
          "reward_model.samples_per_round", rm.samples_per_round,
          f"{trainings} reward-model training(s) of {rm.samples_per_round} samples would use the whole budget of "
          f"{cfg.budget.amount:g} samples (they count against it): lower it or reward_model.rounds")
    if rm.type == "prm" and not has_step_checker(cfg.task.name):
        check(rm.init is not None and rm.rounds == 1, "reward_model.type", rm.type,
              f"task '{cfg.task.name}' has no exact step checker to label the policy's samples during the run: "
              f"train a PRM with `harness rm train --step-labels mc` and give it as reward_model.init with "
              f"reward_model.rounds=1, or use reward_model.type=implicit")


def budget_stages(cfg) -> Optional[int]:
    """How many training stages the budget holds (None where the unit does not say: tokens, seconds)."""
    if cfg.budget.unit == "steps":
        return int(cfg.budget.amount)
    if cfg.budget.unit == "samples":
        return math.ceil(cfg.budget.amount / stage_samples(cfg.train.prompts_per_step, cfg.sampling.samples_per_prompt))
    return None


def config_warnings(cfg) -> list[str]:
    """What a valid config will do that its author may not expect, one line each (the commands
    print them before any work): evaluation points other than ``budget.eval_points`` asks (they
    fall on stage boundaries), and an arith evaluation set asked to be larger than the held-out
    problems its knobs allow, which evaluates all of them."""
    out = []
    points = threshold_warning(cfg.budget, stage_samples(cfg.train.prompts_per_step, cfg.sampling.samples_per_prompt))
    if points:
        out.append(points)
    sets = [("task", cfg.task)] + ([("eval.ood", ood_task_spec(cfg))] if cfg.eval.ood.enabled else [])
    for label, spec in sets:
        if spec.name == "arith":
            have = held_out_shortfall(spec, spec.eval_size)
            if have is not None:
                out.append(f"{label}.eval_size={spec.eval_size}: these arith knobs ({describe_knobs(spec)}) allow "
                           f"only {have} held-out problem{'s' if have != 1 else ''}, so the evaluation set "
                           f"holds {have}")
    out += ignored_reward_model(cfg)
    out += ignored_algorithm_fields(cfg)
    if cfg.eval.validation and cfg.task.name == "arith" and cfg.task.disjoint_validation:
        space = problem_space(cfg.task)
        if space.exact and space.validation < cfg.task.eval_size:
            out.append(f"eval.validation: the validation half of the held-out bucket holds {space.validation} "
                       f"problems, fewer than task.eval_size={cfg.task.eval_size}, so the validation set holds "
                       f"{space.validation}")
    elif cfg.eval.validation and cfg.task.name == "arith":
        have = held_out_shortfall(cfg.task, 2 * cfg.task.eval_size)
        if have is not None and have > cfg.task.eval_size:
            out.append(f"eval.validation: the validation split gets the {have - cfg.task.eval_size} held-out "
                       f"problems the test set leaves, fewer than task.eval_size={cfg.task.eval_size}")
    return out


def ignored_reward_model(cfg) -> list[str]:
    """A ``reward_model`` field set without ``reward_model.type``: read by `harness rm train` only,
    never by a run (it does not enter the run id either: :func:`harness.rundir.ids.run_id`)."""
    rm = cfg.reward_model
    if rm.type is not None:
        return []
    default = type(rm)()
    changed = [f.name for f in dataclasses.fields(rm) if getattr(rm, f.name) != getattr(default, f.name)]
    if not changed:
        return []
    return [f"reward_model.{', reward_model.'.join(changed)} set without reward_model.type: a run reads no "
            f"reward-model field without a type (orm, prm or implicit), so this run ignores "
            f"{'them' if len(changed) > 1 else 'it'} (the run id too); `harness rm train` reads them"]


IGNORED_WHEN = (
    (("clip_eps", "eps_low", "eps_high", "ratio_level"), lambda a: a.policy_loss == "sft_nll",
     "its policy loss, sft_nll (online RFT), has no importance ratio to clip"),
    (("gae_gamma", "gae_lambda", "critic_lr", "value_clip", "value_coef", "critic_warmup_steps"),
     lambda a: not a.critic, "it trains no critic (only PPO's GAE reads these)"),
    (("max_resample",), lambda a: not a.drop_zero_variance,
     "dynamic sampling is off (algorithm.drop_zero_variance is false)"),
    (("overlong_penalty",), lambda a: not a.overlong_buffer, "the soft overlong penalty is off (algorithm."
     "overlong_buffer is 0)"),
    (("correction_cap",), lambda a: a.correction == "none", "algorithm.correction is none"),
    (("kl_estimator", "kl_placement"), lambda a: a.kl_coef == 0, "its KL weight is 0 (algorithm.kl_coef)"),
    (("dr_grpo_norm",), lambda a: a.aggregation != "seq-mean-token-sum-norm",
     "only the seq-mean-token-sum-norm aggregation (Dr. GRPO) reads it"),
    (("prm",), lambda a: a.reward != "process", "its reward is the outcome only (algorithm.reward is not process)"),
)
# a path in algorithm.prm is still checked (and refused in one line) whether or not the reward reads it: the
# commands print these warnings only once the admission gate has passed the config
"""(algorithm fields, when the resolved algorithm ignores them, why): :func:`ignored_algorithm_fields`."""


def _ignored_changes(cfg) -> list[tuple[tuple, str]]:
    """(fields set away from their default that the resolved algorithm never reads, why) per rule of
    :data:`IGNORED_WHEN` that holds for ``cfg``."""
    given, default = cfg.algorithm, type(cfg.algorithm)()
    out = []
    for fields, ignored, why in IGNORED_WHEN:
        if ignored(cfg.algo):
            changed = tuple(f for f in fields if getattr(given, f) != getattr(default, f))
            if changed:
                out.append((changed, why))
    return out


def identity_algorithm(cfg):
    """The resolved algorithm section a run id hashes: :attr:`Config.algo` with every field the algorithm
    ignores (:data:`IGNORED_WHEN`) back at its default, so that a field which changes nothing a run computes
    does not change its id either (a run's config.yaml, which writes every field out, names the same run)."""
    changes = _ignored_changes(cfg)
    if not changes:
        return cfg.algo
    default = type(cfg.algorithm)()
    reset = {f: getattr(default, f) for fields, _ in changes for f in fields}
    return resolve(dataclasses.replace(cfg.algorithm, **reset))


def ignored_algorithm_fields(cfg) -> list[str]:
    """An algorithm field set (away from its default in the config as given) that the resolved algorithm never
    reads, e.g. a clip range on online RFT, or GAE's lambda on GRPO: the run goes on, one line says so, and the
    field is left out of the run id (:func:`identity_algorithm`)."""
    given = cfg.algorithm
    out = []
    for changed, why in _ignored_changes(cfg):
        names = ", ".join(f"algorithm.{f}={getattr(given, f)!r}" for f in changed)
        out.append(f"{names}: algorithm {cfg.algo.name!r} ignores {'them' if len(changed) > 1 else 'it'} (and so "
                   f"does the run id): {why}")
    return out


def warmup_long_spec(cfg):
    """The task the warm-up's longer solutions (``warmup.long_share``) are drawn from: the run's
    task with exactly ``warmup.long_ops`` operations."""
    return dataclasses.replace(cfg.task, min_ops=cfg.warmup.long_ops, max_ops=cfg.warmup.long_ops)


def ood_task_spec(cfg):
    """The out-of-domain set's task: the run's task with ``eval.ood``'s knobs changed."""
    spec = dataclasses.replace(cfg.task, **cfg.eval.ood.overrides())
    try:
        spec.validate(evaluate_only=True)  # only scored: its knobs need held-out problems, not training ones
    except ConfigError as e:
        raise ConfigError(f"eval.ood: {e}") from None
    return spec
