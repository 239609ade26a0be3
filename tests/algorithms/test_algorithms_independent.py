"""Every preset's update against an independent implementation of the paper's equations.

For each algorithm of ``algorithms.presets.ALGORITHMS`` the gradient the learner hands its
optimizer(s) is compared with a gradient computed here from the equations alone (DeepSeekMath,
arXiv 2402.03300: PPO eq. 1-2 with GAE, GRPO eq. 3-4 with outcome §4.1.2 and process §4.1.3
supervision, online RFT §5.2.1; Dr. GRPO, Liu et al. 2025; RLOO, Ahmadian et al. 2024; PRIME, Cui et
al. 2025, eq. 5): nothing of
the project's loss / advantage / objective code is imported. The models run through the plain
``transformers`` forward, one unpadded sequence at a time (the learner uses its own batched,
padded forward), at the sampling temperature.

Stated conventions the independent side follows (the run config's documented meaning):
- groups are G consecutive rows; GRPO's std is the population std plus ``std_eps`` (1e-4), a group
  whose rewards are all equal has advantage 0;
- GRPO-family losses are -1/|S| sum_i 1/|o_i| sum_t [min(r A, clip(r, 1-eps, 1+eps) A) - beta k3]
  over a mini-batch slice S (token-mean: divided by the slice's tokens; Dr. GRPO: token sums
  divided by |S| * L_max, L_max = sampling.max_new_tokens);
- PPO: per-token reward -beta (log pi_old - log pi_ref) plus the outcome on the last token (EOS),
  GAE (gamma 1, lambda 0.95) on the critic's values from before the update, advantages whitened
  over the batch (masked mean, unbiased variance, eps 1e-8), clipped value loss
  value_coef * 0.5 max((V - R)^2, (clip(V, V_old +- 0.2) - R)^2) with R = GAE + V_old;
- online RFT: -1/|S| sum_i I(o_i) 1/|o_i| sum_t log pi (I: correct; rft_dedup: first copy of each
  distinct correct text of a group), S the *sampled* rows of the slice;
- ``train.mini_batches`` = M: the B rows cut in order into M slices of B // M rows, one optimizer
  step each, ``inner_epochs`` passes; old log-probs and values are those before the first step.
"""
import copy

import pytest
import torch

from algorithms.presets import ALGORITHMS, resolve
from harness.config.schema import ModelConfig, load_config
from harness.engine.learner import Learner, ValueModel
from harness.engine.models import build_char_tokenizer, build_tiny_model
from harness.engine.perf import PerfTracker
from harness.engine.sampling import Rollouts

SMALL = ModelConfig(hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64)
PROMPTS = ["Q:1+2\nA:", "Q:3*4-1\nA:"]
G = 4
# group 0: rows 0 and 1 are the same correct text (RFT's duplicates); group 1: one correct of four
COMPLETIONS = ["1+2=3;#3", "1+2=3;#3", "#4", "1+2=3;#3 ",
               "3*4=12;12-1=11;#11", "#11", "3*4=12;#12", "4-1=3;#9"]
REWARDS = [1.0, 1.0, 0.0, 1.0, 0.0, 1.0, 0.0, 0.0]
# process rewards (reward, token index where the step ends), for grpo_ps
STEPS = [[(1.0, 5), (1.0, 7)], [(1.0, 5), (1.0, 7)], [(0.0, 1)], [(1.0, 5), (0.0, 8)],
         [(1.0, 6), (1.0, 13), (0.0, 16)], [(1.0, 2)], [(1.0, 6), (0.0, 9)], [(0.0, 4), (0.0, 7)]]
L_MAX = 20  # sampling.max_new_tokens: Dr. GRPO's constant normaliser
CLIP, BETA_DEFAULT, STD_EPS, LAM = 0.2, 0.04, 1e-4, 0.95
CASES = {
    "one_step": [],
    "temperature": ["sampling.temperature=0.7"],
    "micro_batches": ["train.micro_batch_size=3"],
    "several_steps": ["train.mini_batches=2", "train.inner_epochs=2", "train.micro_batch_size=3",
                      "sampling.temperature=0.8", "train.lr=3e-2", "algorithm.critic_lr=3e-2"],
}


# ---------------------------------------------------------------------------- data
def encode():
    tok = build_char_tokenizer()
    prompts = [tok.encode(p) for p in PROMPTS for _ in range(G)]
    comps = [tok.encode(c, add_special_tokens=False) + [tok.eos_token_id] for c in COMPLETIONS]
    assert all(len(c) <= L_MAX for c in comps) and tok.decode(comps[4][:-1]) == COMPLETIONS[4]
    return tok, prompts, comps


def make_rollouts(tok, prompts, comps, old_logps) -> Rollouts:
    B, P, T = len(comps), max(map(len, prompts)), max(map(len, comps))
    pid, pm = torch.full((B, P), tok.pad_token_id), torch.zeros(B, P, dtype=torch.long)
    cid, cm = torch.full((B, T), tok.pad_token_id), torch.zeros(B, T, dtype=torch.long)
    lp = torch.zeros(B, T)
    for i, (p, c) in enumerate(zip(prompts, comps)):
        pid[i, P - len(p):], pm[i, P - len(p):] = torch.tensor(p), 1  # prompts left-padded
        cid[i, :len(c)], cm[i, :len(c)] = torch.tensor(c), 1
        lp[i, :len(c)] = old_logps[i]  # what the sampler records: log-probs at its temperature
    return Rollouts(prompts=[p for p in PROMPTS for _ in range(G)], completions=list(COMPLETIONS),
                    finished=[True] * B, prompt_ids=pid, prompt_mask=pm, completion_ids=cid, completion_mask=cm,
                    logprobs=lp, n=G)


# ---------------------------------------------------------------------------- the equations
def logps(model, prompts, comps, tau):
    """log pi(o_t | q, o_<t) at temperature tau, one unpadded sequence at a time: list of [|o_i|]."""
    out = []
    for p, c in zip(prompts, comps):
        logits = model(input_ids=torch.tensor([p + c])).logits[0].float()
        lg = logits[len(p) - 1:len(p) + len(c) - 1] / tau
        out.append(torch.log_softmax(lg, -1).gather(-1, torch.tensor(c)[:, None]).squeeze(-1))
    return out


def values(critic, prompts, comps):
    """V(s_t) for every completion token t, read at the position that predicts token t."""
    out = []
    for p, c in zip(prompts, comps):
        h = critic.backbone(input_ids=torch.tensor([p + c])).last_hidden_state[0]
        out.append(critic.head(h[len(p) - 1:len(p) + len(c) - 1]).squeeze(-1).float())
    return out


def mean(xs):
    return sum(xs) / len(xs)


def pop_std(xs):
    m = mean(xs)
    return (sum((x - m) ** 2 for x in xs) / len(xs)) ** 0.5


def shaped_rewards(algo, comps):
    """The outcome rewards plus DAPO's soft overlong punishment (eq. 13) where the algorithm has one:
    L_cache = overlong_buffer * L_max tokens; -(|o| - (L_max - L_cache)) / L_cache beyond L_max - L_cache."""
    if not algo.overlong_buffer:
        return list(REWARDS)
    cache = round(algo.overlong_buffer * L_MAX)
    return [r + algo.overlong_penalty * min(0.0, max(-1.0, (L_MAX - cache - len(c)) / cache))
            for r, c in zip(REWARDS, comps)]


def group_advantages(kind, rewards=REWARDS):
    """Per row, a constant advantage (outcome supervision)."""
    out = []
    for g in range(0, len(rewards), G):
        r = rewards[g:g + G]
        for i in range(G):
            if kind == "grpo":
                s = pop_std(r)
                out.append(0.0 if s == 0 else (r[i] - mean(r)) / (s + STD_EPS))
            elif kind == "dr_grpo":
                out.append(r[i] - mean(r))
            elif kind == "rloo":
                out.append(r[i] - (sum(r) - r[i]) / (G - 1))
            elif kind == "lite_ppo":  # Lite PPO: group mean, the std of every reward of the batch
                out.append((r[i] - mean(r)) / (pop_std(rewards) + STD_EPS))
    return out


def process_advantages(comps):
    """§4.1.3: step rewards normalised over the group's steps; A_t = sum of those ending at or after t."""
    out = []
    for g in range(0, len(comps), G):
        allr = [r for i in range(g, g + G) for r, _ in STEPS[i]]
        m, s = mean(allr), pop_std(allr)
        for i in range(g, g + G):
            a = torch.zeros(len(comps[i]))
            for r, end in STEPS[i]:
                a[:min(end, len(comps[i]) - 1) + 1] += (r - m) / (s + STD_EPS)
            out.append(a)
    return out


def prime_advantages(comps):
    """PRIME eq. 5 (gamma 1): each step reward on the token where the step ends; per row, the return of
    (process reward - the mean over the group's other rows of their process reward per token), plus
    RLOO's outcome advantage."""
    out = []
    for g in range(0, len(comps), G):
        toks, pbar = [], []
        for i in range(g, g + G):
            p = torch.zeros(len(comps[i]))
            for r, end in STEPS[i]:
                p[min(end, len(comps[i]) - 1)] += r
            toks.append(p)
            pbar.append(float(p.sum()) / len(comps[i]))
        r = REWARDS[g:g + G]
        for k in range(G):
            shifted = toks[k] - (sum(pbar) - pbar[k]) / (G - 1)
            returns = torch.flip(torch.cumsum(torch.flip(shifted, [0]), 0), [0])
            out.append(returns + (r[k] - (sum(r) - r[k]) / (G - 1)))
    return out


def ppo_advantages(old, ref, v_old, beta):
    """Eq. 2's per-token reward, GAE (gamma 1), whitening; returns (whitened A, returns R)."""
    adv, ret = [], []
    for i, (o, r_, v) in enumerate(zip(old, ref, v_old)):
        rew = -beta * (o - r_)
        rew[-1] += REWARDS[i]
        a, last = torch.zeros_like(v), 0.0
        for t in reversed(range(len(v))):
            nxt = v[t + 1] if t + 1 < len(v) else 0.0
            last = rew[t] + nxt - v[t] + LAM * last
            a[t] = last
        adv.append(a)
        ret.append(a + v)
    flat = torch.cat(adv)
    mu, var = flat.mean(), ((flat - flat.mean()) ** 2).sum() / (flat.numel() - 1)
    return [(a - mu) / torch.sqrt(var + 1e-8) for a in adv], ret


def reinforce_pp_advantages(old, ref, beta, baseline):
    """REINFORCE++ eq. 8-10: A_t = r - beta sum_{i >= t} (log pi_old - log pi_ref) (with ``baseline``, r less
    its group's mean), then normalised over every token of the batch (mean, unbiased variance, eps 1e-8)."""
    adv = []
    for i, (o, r_) in enumerate(zip(old, ref)):
        g = i // G * G
        outcome = REWARDS[i] - (mean(REWARDS[g:g + G]) if baseline else 0.0)
        kl = o - r_
        adv.append(torch.stack([outcome - beta * kl[t:].sum() for t in range(len(o))]))
    flat = torch.cat(adv)
    mu, var = flat.mean(), ((flat - flat.mean()) ** 2).sum() / (flat.numel() - 1)
    return [(a - mu) / torch.sqrt(var + 1e-8) for a in adv]


def rft_indicator(dedup):
    keep = []
    for g in range(0, len(REWARDS), G):
        seen = set()
        for i in range(g, g + G):
            ok = REWARDS[i] > 0 and not (dedup and COMPLETIONS[i] in seen)
            seen.add(COMPLETIONS[i]) if REWARDS[i] > 0 else None
            keep.append(1.0 if ok else 0.0)
    return keep


def surrogate_tokens(algo, lp_i, old_i, adv_i):
    """Per-token surrogate of one output: PPO's clipped ratio with the range [1 - eps_low, 1 + eps_high]
    (DAPO eq. 10), the ratio per token or, at sequence level, GSPO's (pi / pi_old) ** (1 / |o|) (eq. 7)
    written as the product of the token ratios to the power 1 / |o|."""
    lo, hi = algo.eps_low, algo.eps_high
    if algo.ratio_level == "sequence":
        ratio = torch.prod(torch.exp(lp_i - old_i)) ** (1.0 / len(lp_i)) * torch.ones_like(lp_i)
    else:
        ratio = torch.exp(lp_i - old_i)
    return -torch.minimum(ratio * adv_i, torch.clamp(ratio, 1 - lo, 1 + hi) * adv_i)


def policy_loss(algo, lp, old, ref, adv, rows, beta):
    """The loss of slice ``rows``; every term from the equations above."""
    total = 0.0
    for i in rows:
        if algo.policy_loss == "sft_nll":
            tok = -adv[i] * lp[i]
        elif algo.policy_loss == "cispo":  # MiniMax-M1 eq. 4: the clipped weight is a constant (stop-gradient)
            w = torch.clamp(torch.exp(lp[i] - old[i]), 1 - algo.eps_low, 1 + algo.eps_high).detach()
            tok = -w * adv[i] * lp[i]
        else:
            tok = surrogate_tokens(algo, lp[i], old[i], adv[i])
            if algo.kl_placement == "loss" and beta > 0:
                d = ref[i] - lp[i]
                tok = tok + beta * (torch.exp(d) - d - 1)  # k3, DeepSeekMath eq. 4
        if algo.aggregation == "seq-mean-token-mean":
            total = total + tok.mean() / len(rows)
        elif algo.aggregation == "token-mean":
            total = total + tok.sum() / sum(len(lp[j]) for j in rows)
        else:  # Dr. GRPO
            total = total + tok.sum() / (len(rows) * L_MAX)
    return total


def value_loss(v, v_old, ret, rows, coef=0.5, clip=0.2):
    total = 0.0
    for i in rows:
        vc = v_old[i] + torch.clamp(v[i] - v_old[i], -clip, clip)
        total = total + 0.5 * torch.maximum((v[i] - ret[i]) ** 2, (vc - ret[i]) ** 2).mean() / len(rows)
    return coef * total


def grad_at(model, params, loss_fn):
    m = copy.deepcopy(model)
    for q, v in zip(m.parameters(), params):
        q.data.copy_(v)
    m.zero_grad(set_to_none=True)
    loss = loss_fn(m)
    loss.backward()
    return torch.cat([q.grad.flatten() if q.grad is not None else torch.zeros(q.numel()) for q in m.parameters()])


def capture(opt, model):
    """(parameters before, gradient) at every ``opt.step`` of the learner."""
    seen, step = [], opt.step

    def recording(*a, **kw):
        ps = list(model.parameters())
        seen.append(([q.detach().clone() for q in ps],
                     torch.cat([q.grad.flatten() if q.grad is not None else torch.zeros(q.numel()) for q in ps])))
        return step(*a, **kw)
    opt.step = recording
    return seen


def close(got, want):
    assert want.norm() > 1e-4  # a gradient worth comparing
    err = (got - want).norm() / want.norm()
    assert err < 1e-5, f"relative gradient error {err:.3g}"


# ---------------------------------------------------------------------------- the test
@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("name", list(ALGORITHMS))
def test_learner_gradient_matches_the_paper(name, case):
    torch.manual_seed(0)
    overrides = [f"algorithm={name}", f"sampling.samples_per_prompt={G}", f"sampling.max_new_tokens={L_MAX}",
                 "train.max_grad_norm=0", *CASES[case]]
    if name == "grpo_iter":  # the reference reset happens between steps, not inside one
        overrides.append("algorithm.ref_reset_every=100")
    cfg = load_config(None, overrides)
    algo = resolve(cfg.algorithm)
    tau, E, M = cfg.sampling.temperature, cfg.train.inner_epochs, cfg.train.mini_batches
    beta = algo.kl_coef
    tok, prompts, comps = encode()
    policy = build_tiny_model(SMALL, tok, seed=1)
    policy0 = copy.deepcopy(policy)
    ref = build_tiny_model(SMALL, tok, seed=2).requires_grad_(False) if algo.uses_reference else None
    critic = critic0 = None
    if algo.critic:
        critic = ValueModel(policy)
        torch.nn.init.normal_(critic.head.weight, std=0.5)  # nonzero values, so GAE depends on them
        critic0 = copy.deepcopy(critic)

    # the independent side's fixed quantities: from the parameters before any step
    with torch.no_grad():
        old = logps(policy0, prompts, comps, tau)
        ref_lp = logps(ref, prompts, comps, tau) if ref is not None else None
        v_old = values(critic0, prompts, comps) if critic0 is not None else None
    B = len(comps)
    if algo.critic:
        adv, ret = ppo_advantages(old, ref_lp, v_old, beta)
    elif algo.advantage == "grpo_ps":
        adv = process_advantages(comps)
    elif algo.advantage == "prime":
        adv = prime_advantages(comps)
    elif algo.advantage in ("reinforce_pp", "reinforce_pp_baseline"):
        adv = reinforce_pp_advantages(old, ref_lp, beta, baseline=algo.advantage == "reinforce_pp_baseline")
    elif algo.advantage == "ones":
        adv = rft_indicator(dedup=algo.filter == "correct_dedup")
    else:
        adv = group_advantages(algo.advantage, shaped_rewards(algo, comps))
    adv = [a if torch.is_tensor(a) else torch.full((len(c),), float(a)) for a, c in zip(adv, comps)]

    learner = Learner(policy, algo, cfg, "cpu", PerfTracker(), reference=ref, critic=critic)
    pol_steps = capture(learner.opt, policy)
    crit_steps = capture(learner.critic_opt, critic) if critic is not None else []
    m = learner.step(make_rollouts(tok, prompts, comps, old), torch.tensor(REWARDS), STEPS, 0)

    slices = [range(j * B // M, (j + 1) * B // M) for j in range(M)]
    if algo.filter != "none":  # a slice where nothing is kept takes no step
        slices = [s for s in slices if any(adv[i].abs().sum() > 0 for i in s)]
    assert len(pol_steps) == E * len(slices)
    for k, (params, got) in enumerate(pol_steps):
        rows = slices[k % len(slices)]

        def loss_fn(mdl, rows=rows):
            lp = logps(mdl, prompts, comps, tau)
            return policy_loss(algo, lp, old, ref_lp, adv, rows, beta)
        close(got, grad_at(policy0, params, loss_fn))
    if algo.critic:
        assert len(crit_steps) == E * len(slices)
        for k, (params, got) in enumerate(crit_steps):
            rows = slices[k % len(slices)]
            close(got, grad_at(critic0, params, lambda c, rows=rows: value_loss(values(c, prompts, comps), v_old,
                                                                                 ret, rows)))
    if E * M > 1 and algo.policy_loss in ("ppo_clip", "cispo"):
        # after the first step the ratios move away from 1 (old log-probs are from before it)
        with torch.no_grad():
            now = logps(policy, prompts, comps, tau)
        ratios_moved = max((torch.exp(a - b) - 1).abs().max().item() for a, b in zip(now, old))
        assert ratios_moved > 1e-2 and m["train/ratio_max"] > 1.0
    assert m["train/loss"] == m["train/loss"]  # finite metrics
