"""Samplers: G completions per prompt as :class:`Rollouts`, behind one interface
(:func:`sample` / :func:`get_sampler`, backend named by ``sampling.backend``: ``hf``, ``paged``,
``vllm``). The rest of this docstring is about ``hf``, the reference backend.

Sampler `hf`: G completions per prompt from an in-process transformers model.

Why not ``model.generate``: on a small model the per-token cost is dominated by
generate's machinery (logits processors, stopping criteria, cache bookkeeping), and a
GRPO step is mostly generation. This loop does the same thing with less: each distinct
prompt is prefilled once and its KV cache expanded G ways, only last-position logits are
computed (``logits_to_keep=1``), and decoding stops as soon as every sequence has
produced EOS. Left padding with explicit position ids, as in ``generate``. Llama-architecture
models (the built-in tiny model, SmolLM2, ...) take ``harness.engine.fastlm``'s decode path (fused
weights, a preallocated KV cache written in place); others go through the model's own
forward with a ``DynamicCache``.

Per-token log-probabilities are those of the sampling distribution (logits / T); the
learner computes its own with the same temperature.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional, Sequence

import torch

from harness.config.rules import SAMPLER_BACKENDS
from harness.engine import fastlm, paged, vllm_sampler
from harness.engine.learner import make_batch, token_logprobs


@dataclass
class Rollouts:
    prompts: list[str]
    """One entry per sequence (each prompt repeated n times, prompt-major)."""
    completions: list[str]
    """Decoded completion text, up to (not including) EOS."""
    finished: list[bool]
    """True when the completion ended with EOS (False = truncated at max_new_tokens)."""
    prompt_ids: torch.Tensor
    """[B, P] left-padded prompt tokens."""
    prompt_mask: torch.Tensor
    """[B, P] 1 on real prompt tokens."""
    completion_ids: torch.Tensor
    """[B, T] generated tokens, pad after EOS."""
    completion_mask: torch.Tensor
    """[B, T] 1 on generated tokens up to and including EOS."""
    logprobs: torch.Tensor
    """[B, T] log-prob of each generated token under the sampling distribution."""
    n: int
    """Samples per prompt (group size)."""
    token_offsets: list[list[int]] = field(default_factory=list)
    """Per sequence: for each completion token, the character offset where its text ends."""

    @property
    def num_sequences(self) -> int:
        return len(self.completions)

    @property
    def num_tokens(self) -> int:
        return int(self.completion_mask.sum().item())

    @property
    def lengths(self) -> torch.Tensor:
        return self.completion_mask.sum(1)


def _top_p_filter(logits: torch.Tensor, top_p: float) -> torch.Tensor:
    sorted_logits, idx = torch.sort(logits, descending=True, dim=-1)
    probs = torch.softmax(sorted_logits, dim=-1)
    cum = probs.cumsum(-1)
    remove = cum - probs > top_p  # keep the smallest set whose mass reaches top_p
    sorted_logits = sorted_logits.masked_fill(remove, float("-inf"))
    return torch.empty_like(logits).scatter_(-1, idx, sorted_logits)


def token_end_offsets(tokenizer, ids: list[int], cache: Optional[dict] = None) -> list[int]:
    """Character offset (in the decoded completion) at which each token's text ends.
    ``cache``: a dict reused across calls (token id -> its decoded text)."""
    if not ids:
        return []
    if cache is None:
        cache = {}
    pieces = []
    for i in ids:
        piece = cache.get(i)
        if piece is None:
            piece = cache[i] = tokenizer.decode([i], skip_special_tokens=True)
        pieces.append(piece)
    full = tokenizer.decode(ids, skip_special_tokens=True)
    if sum(map(len, pieces)) == len(full):  # character tokenizers, most byte-level BPEs
        out, acc = [], 0
        for p in pieces:
            acc += len(p)
            out.append(acc)
        return out
    return [len(tokenizer.decode(ids[: k + 1], skip_special_tokens=True)) for k in range(len(ids))]


def char_to_token_index(offsets: list[int], char_end: int) -> int:
    """Index of the token whose text reaches character ``char_end`` (clamped to the last token)."""
    for k, off in enumerate(offsets):
        if off >= char_end:
            return k
    return max(len(offsets) - 1, 0)


class _StopStrings:
    """Which rows' completions now contain one of ``stop`` (strings), checked after every token
    on the decoded tail of each row still decoded (the last ``window`` tokens: the longest stop
    string in characters, plus slack, since a token decodes to at least one character)."""

    def __init__(self, tokenizer, stop: Sequence[str]):
        self.tok, self.stop = tokenizer, tuple(s for s in stop if s)
        self.window = max((len(s) for s in self.stop), default=0) + 4

    def hits(self, tokens: torch.Tensor, idx: torch.Tensor, t: int) -> torch.Tensor:
        """The rows of ``idx`` (indices into ``tokens``) whose tokens up to column ``t`` hold a stop string."""
        if not self.stop or idx.numel() == 0:
            return idx[:0]
        tails = tokens[idx, max(0, t + 1 - self.window):t + 1].tolist()
        texts = self.tok.batch_decode(tails, skip_special_tokens=True)
        return idx[[any(s in text for s in self.stop) for text in texts]]


class _ModelDecoder:
    """Decoding through the model's own forward and a ``DynamicCache`` (any causal LM): every row
    is decoded at every step."""

    rows = None  # the rows decoded: all of them

    def __init__(self, model, p_ids, p_mask, n: int, max_new_tokens: int):
        self.model, self.p_ids, self.p_mask, self.n = model, p_ids, p_mask, n

    def prefill(self) -> torch.Tensor:
        """Last-position logits of each distinct prompt; the cache then holds G copies of each."""
        from transformers import DynamicCache

        pos = (self.p_mask.long().cumsum(-1) - 1).clamp_min(0)
        out = self.model(input_ids=self.p_ids, attention_mask=self.p_mask, position_ids=pos,
                         past_key_values=DynamicCache(), use_cache=True, logits_to_keep=1)
        self.cache = out.past_key_values
        if self.n > 1:
            self.cache.batch_repeat_interleave(self.n)
        self.attn = self.p_mask.repeat_interleave(self.n, 0) if self.n > 1 else self.p_mask
        self.next_pos = (pos.repeat_interleave(self.n, 0) if self.n > 1 else pos)[:, -1:] + 1
        return out.logits[:, -1, :]

    def step(self, tok: torch.Tensor, live: torch.Tensor, n_live: int) -> torch.Tensor:
        """Feed one token per row; the next logits."""
        self.attn = torch.cat([self.attn, torch.ones((self.attn.shape[0], 1), dtype=self.attn.dtype,
                                                     device=self.attn.device)], dim=1)
        out = self.model(input_ids=tok[:, None], attention_mask=self.attn, position_ids=self.next_pos,
                         past_key_values=self.cache, use_cache=True, logits_to_keep=1)
        self.cache = out.past_key_values
        self.next_pos = self.next_pos + 1
        return out.logits[:, -1, :]


class _FastDecoder:
    """Decoding through :mod:`harness.engine.fastlm` (Llama-architecture models): a preallocated KV
    cache written in place, from which finished rows are dropped once a quarter of the rows
    decoded have ended (``rows``: the chunk's rows still decoded, None while all are)."""

    def __init__(self, model, p_ids, p_mask, n: int, max_new_tokens: int):
        self.p_ids, self.p_mask, self.n = p_ids, p_mask, n
        self.state = fastlm.DecodeState(model, p_ids.shape[1] + max_new_tokens)
        self.rows: Optional[torch.Tensor] = None

    def prefill(self) -> torch.Tensor:
        """Last-position logits of each distinct prompt (one prefill each, its cache written G times)."""
        return self.state.prefill(self.p_ids, self.p_mask, self.n)

    def step(self, tok: torch.Tensor, live: torch.Tensor, n_live: int) -> torch.Tensor:
        """Drop the ended rows when enough have ended, feed one token per row left; the next logits."""
        if n_live <= 0.75 * live.numel():
            keep = live.nonzero().squeeze(1)
            self.state.keep_rows(keep)
            self.rows = keep if self.rows is None else self.rows[keep]
            tok = tok[keep]
        return self.state.step(tok)


def _draw(logits: torch.Tensor, greedy: bool, temperature: float, top_p: float,
          generator: Optional[torch.Generator], B: int, rows: Optional[torch.Tensor]):
    """(token, its log-prob under logits / T) of every decoded row: the argmax when greedy, else a
    draw from the top-p nucleus. Gumbel-max: argmax(log p + G), G = -log(-log U), is a draw from
    softmax(filtered); one uniform per logit (cheaper than multinomial's exponential draws), drawn
    for every row of the chunk (``B``) even when finished rows are no longer decoded (``rows``), so
    the samples do not depend on which rows were dropped (or on the forward path)."""
    if greedy:
        tok = logits.argmax(-1)
        return tok, torch.log_softmax(logits, -1).gather(-1, tok[:, None])[:, 0]
    logp_all = torch.log_softmax(logits / temperature, -1)
    filtered = _top_p_filter(logp_all, top_p) if top_p < 1.0 else logp_all
    u = torch.rand((B, filtered.shape[1]), generator=generator, device=filtered.device, dtype=filtered.dtype)
    if rows is not None:
        u = u[rows]
    gumbel = u.log_().neg_().log_().neg_()
    tok = (filtered + gumbel).argmax(-1)
    return tok, logp_all.gather(-1, tok[:, None])[:, 0]


class _Completions:
    """A chunk's completions as they are decoded: tokens, their log-probs, which rows still run
    (a row ends at EOS, or at a stop string), and at the end the completion masks."""

    def __init__(self, B: int, max_new_tokens: int, tokenizer, device, stop: Sequence[str]):
        self.eos = tokenizer.eos_token_id
        self.pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else self.eos
        self.tokens = torch.full((B, max_new_tokens), self.pad, dtype=torch.long, device=device)
        self.lps = torch.zeros((B, max_new_tokens), dtype=torch.float32, device=device)
        self.alive = torch.ones(B, dtype=torch.bool, device=device)
        self.stops = _StopStrings(tokenizer, stop) if stop else None
        self.stopped_at = torch.zeros(B, dtype=torch.long, device=device)  # tokens kept by a row that hit a stop string
        self.steps = 0

    def record(self, t: int, tok: torch.Tensor, lp: torch.Tensor, rows: Optional[torch.Tensor]):
        """Column ``t``: the drawn tokens of the decoded rows (``rows``; None: all), pad and
        log-prob 0 on rows that have ended. Returns (the tokens as recorded, which decoded rows
        still run)."""
        live = self.alive if rows is None else self.alive[rows]
        tok = torch.where(live, tok, torch.full_like(tok, self.pad))
        lp = torch.where(live, lp, torch.zeros_like(lp))
        live = live & (tok != self.eos)
        if rows is None:
            self.tokens[:, t], self.lps[:, t], self.alive = tok, lp, live
        else:
            self.tokens[rows, t], self.lps[rows, t] = tok, lp
            self.alive[rows] = live
        if self.stops is not None:  # a row whose text now holds a stop string ends here, like at EOS
            hit = self.stops.hits(self.tokens, self.alive.nonzero().squeeze(1), t)
            if hit.numel():
                self.alive[hit] = False
                self.stopped_at[hit] = t + 1
                live = self.alive if rows is None else self.alive[rows]
        self.steps = t + 1
        return tok, live

    def finish(self):
        """(tokens, completion mask, log-probs masked, finished) over the columns decoded."""
        steps, eos = self.steps, self.eos
        tokens, lps = self.tokens[:, :steps], self.lps[:, :steps]
        is_eos = tokens == eos
        # mask: every generated token up to and including the first EOS (a sampled <pad> before
        # EOS is a real token the sampler attended to; only what follows EOS is padding)
        after_eos = (is_eos.long().cumsum(1) - is_eos.long()) > 0
        c_mask = (~after_eos).long()
        finished = is_eos.any(1)
        if self.stops is not None:  # a row ended by a stop string: its tokens up to the one completing it
            ended = self.stopped_at > 0
            kept = torch.arange(steps, device=tokens.device)[None, :] < self.stopped_at[:, None]
            c_mask = c_mask * (kept | ~ended[:, None]).long()
            finished = finished | ended
        return tokens, c_mask, lps * c_mask, finished


@torch.no_grad()
def _sample_chunk(model, tokenizer, prompts: list[str], n: int, max_new_tokens: int, temperature: float,
                  top_p: float, greedy: bool, generator: Optional[torch.Generator], device,
                  stop: Sequence[str] = ()):
    """One chunk of prompts: each distinct prompt prefilled once, then one token drawn per row per
    step until every row has ended or ``max_new_tokens``. Returns (prompt ids, prompt mask, tokens,
    completion mask, log-probs, finished), G rows per prompt."""
    enc = tokenizer(prompts, return_tensors="pt", padding=True, add_special_tokens=True)
    p_ids, p_mask = enc["input_ids"].to(device), enc["attention_mask"].to(device)
    dec = (_FastDecoder if fastlm.supported(model) else _ModelDecoder)(model, p_ids, p_mask, n, max_new_tokens)
    logits = dec.prefill()
    if n > 1:  # G rows per prompt
        logits = logits.repeat_interleave(n, 0)
        p_ids, p_mask = p_ids.repeat_interleave(n, 0), p_mask.repeat_interleave(n, 0)
    B = p_ids.shape[0]
    out = _Completions(B, max_new_tokens, tokenizer, device, stop)
    for t in range(max_new_tokens):
        tok, lp = _draw(logits.float(), greedy, temperature, top_p, generator, B, dec.rows)
        tok, live = out.record(t, tok, lp, dec.rows)
        n_live = int(live.sum())
        if n_live == 0 or t == max_new_tokens - 1:
            break
        logits = dec.step(tok, live, n_live)
    return (p_ids, p_mask, *out.finish())


def _pad_cat(tensors: list[torch.Tensor], value, left: bool) -> torch.Tensor:
    width = max(t.shape[1] for t in tensors)
    out = []
    for t in tensors:
        padn = width - t.shape[1]
        if padn:
            fill = torch.full((t.shape[0], padn), value, dtype=t.dtype, device=t.device)
            t = torch.cat([fill, t] if left else [t, fill], dim=1)
        out.append(t)
    return torch.cat(out, 0)


BACKENDS = SAMPLER_BACKENDS
"""Sampler backends (``sampling.backend``, whose rule lists them): ``hf`` (:func:`sample_hf`, the reference), ``paged``
(transformers' continuous batching, :mod:`harness.engine.paged`), ``vllm`` (optional,
:mod:`harness.engine.vllm_sampler`; only where vllm imports)."""


def _rollouts(tokenizer, prompts: list[str], n: int, p_ids, p_mask, c_ids, c_mask, lps, finished: list[bool],
              offsets: bool) -> Rollouts:
    """Decode the completions (up to, not including, EOS) and build the :class:`Rollouts`."""
    lengths = c_mask.sum(1).tolist()
    ids_list = c_ids.tolist()
    texts, offs = [], []
    pieces: dict = {}
    eos = tokenizer.eos_token_id
    for row, L in zip(ids_list, lengths):
        ids = [i for i in row[:L] if i != eos]
        texts.append(tokenizer.decode(ids, skip_special_tokens=True))
        offs.append(token_end_offsets(tokenizer, ids, pieces) if offsets else [])
    return Rollouts(prompts=[p for p in prompts for _ in range(n)], completions=texts, finished=finished,
                    prompt_ids=p_ids, prompt_mask=p_mask, completion_ids=c_ids, completion_mask=c_mask,
                    logprobs=lps, n=n, token_offsets=offs)


def _pad_id(tokenizer) -> int:
    return tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id


@torch.no_grad()
def sample_hf(model, tokenizer, prompts: list[str], n: int = 1, max_new_tokens: int = 32, temperature: float = 1.0,
              top_p: float = 1.0, greedy: bool = False, seed: int = 0, batch_size: Optional[int] = None,
              offsets: bool = True, stop: Sequence[str] = ()) -> Rollouts:
    """Backend ``hf``: the in-process KV-cached decoding loop of this module (see its docstring).
    ``stop``: strings that end a completion as EOS does (checked after each token; the completion
    keeps the stop string and is ``finished``): evaluation protocols that cut at a stop sequence
    (``evals.protocols``) stop decoding there instead of running to ``max_new_tokens``. A row's
    tokens do not depend on when the other rows stop."""
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    gen = torch.Generator(device=device)
    gen.manual_seed(int(seed) & 0x7FFFFFFFFFFFFFFF)
    per_chunk = max(1, (batch_size or (len(prompts) * n)) // n)
    parts = []
    try:
        for s in range(0, len(prompts), per_chunk):
            parts.append(_sample_chunk(model, tokenizer, prompts[s:s + per_chunk], n, max_new_tokens, temperature,
                                       top_p, greedy, gen, device, stop))
    finally:
        model.train(was_training)
    pad = _pad_id(tokenizer)
    p_ids = _pad_cat([p[0] for p in parts], pad, left=True)
    p_mask = _pad_cat([p[1] for p in parts], 0, left=True)
    c_ids = _pad_cat([p[2] for p in parts], pad, left=False)
    c_mask = _pad_cat([p[3] for p in parts], 0, left=False)
    lps = _pad_cat([p[4] for p in parts], 0.0, left=False)
    finished = torch.cat([p[5] for p in parts]).tolist()
    return _rollouts(tokenizer, prompts, n, p_ids, p_mask, c_ids, c_mask, lps, finished, offsets)


def _sample_from_lists(generate, model, tokenizer, prompts: list[str], n: int, max_new_tokens: int,
                       temperature: float, top_p: float, greedy: bool, seed: int, offsets: bool) -> Rollouts:
    """Rollouts from an engine that returns per-sequence token lists (and log-probs):
    ``generate(model, tokenizer, prompt_rows, n, max_new_tokens, temperature, top_p, greedy, seed,
    want_logprobs) -> (token lists, log-prob lists or None)``, prompt-major. Log-probs: the
    engine's at top_p = 1 (log softmax of logits / T); with top_p < 1 one scoring forward
    (:func:`harness.engine.learner.token_logprobs` at T), since an engine's are those of the
    renormalised nucleus while this harness's convention is logits / T before the cut."""
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    if tokenizer.padding_side != "left":
        raise ValueError("the tokenizer must pad on the left (load_policy sets this)")
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    enc = tokenizer(prompts, return_tensors="pt", padding=True, add_special_tokens=True)
    p_ids, p_mask = enc["input_ids"], enc["attention_mask"]
    rows = [ids[m.bool()].tolist() for ids, m in zip(p_ids, p_mask)]
    score_forward = top_p < 1.0 and not greedy
    try:
        toks, lps_list = generate(model, tokenizer, rows, n, max_new_tokens, temperature, top_p, greedy, seed,
                                  not score_forward)
    finally:
        model.train(was_training)
    B, T = len(toks), max(1, max(len(t) for t in toks))
    pad, eos = _pad_id(tokenizer), tokenizer.eos_token_id
    c_ids = torch.full((B, T), pad, dtype=torch.long)
    lps = torch.zeros((B, T), dtype=torch.float32)
    c_mask = torch.zeros((B, T), dtype=torch.long)
    finished = []
    for i, t in enumerate(toks):
        L = next((k + 1 for k, tok in enumerate(t) if tok == eos), len(t))  # up to and including EOS
        c_ids[i, :L] = torch.tensor(t[:L], dtype=torch.long)
        c_mask[i, :L] = 1
        if lps_list is not None:
            lps[i, :L] = torch.tensor(lps_list[i][:L], dtype=torch.float32)
        finished.append(L > 0 and t[L - 1] == eos)
    p_ids, p_mask = p_ids.repeat_interleave(n, 0).to(device), p_mask.repeat_interleave(n, 0).to(device)
    c_ids, c_mask, lps = c_ids.to(device), c_mask.to(device), lps.to(device)
    ro = _rollouts(tokenizer, prompts, n, p_ids, p_mask, c_ids, c_mask, lps, finished, offsets)
    if score_forward or lps_list is None:  # the engine gave none it could vouch for: recompute at T
        ro.logprobs = (token_logprobs(model, make_batch(ro, device), temperature) * c_mask).float()
    return ro


@torch.no_grad()
def sample_paged(model, tokenizer, prompts: list[str], n: int = 1, max_new_tokens: int = 32,
                 temperature: float = 1.0, top_p: float = 1.0, greedy: bool = False, seed: int = 0,
                 batch_size: Optional[int] = None, offsets: bool = True) -> Rollouts:
    """Backend ``paged``: transformers' continuous batching (:mod:`harness.engine.paged`).
    ``batch_size`` is ignored (the manager schedules every sequence within its paged cache)."""
    return _sample_from_lists(paged.generate, model, tokenizer, prompts, n, max_new_tokens, temperature, top_p,
                              greedy, seed, offsets)


@torch.no_grad()
def sample_vllm(model, tokenizer, prompts: list[str], n: int = 1, max_new_tokens: int = 32,
                temperature: float = 1.0, top_p: float = 1.0, greedy: bool = False, seed: int = 0,
                batch_size: Optional[int] = None, offsets: bool = True) -> Rollouts:
    """Backend ``vllm`` (optional, unverified): :mod:`harness.engine.vllm_sampler`."""
    return _sample_from_lists(vllm_sampler.generate, model, tokenizer, prompts, n, max_new_tokens, temperature,
                              top_p, greedy, seed, offsets)


_SAMPLERS = {"hf": sample_hf, "paged": sample_paged}
if vllm_sampler.available():
    _SAMPLERS["vllm"] = sample_vllm


def get_sampler(backend: str = "hf"):
    """The sampling function of ``backend`` (same signature and :class:`Rollouts` as :func:`sample`)."""
    if backend not in BACKENDS:
        raise ValueError(f"unknown sampler backend {backend!r}; choose one of {', '.join(BACKENDS)}")
    if backend not in _SAMPLERS:
        raise RuntimeError(f"sampler backend {backend!r} is not available here: {vllm_sampler.unavailable_reason()}")
    return _SAMPLERS[backend]


@torch.no_grad()
def sample(model, tokenizer, prompts: list[str], n: int = 1, max_new_tokens: int = 32, temperature: float = 1.0,
           top_p: float = 1.0, greedy: bool = False, seed: int = 0, batch_size: Optional[int] = None,
           offsets: bool = True, backend: str = "hf", stop: Sequence[str] = ()) -> Rollouts:
    """Sample ``n`` completions for every prompt (prompt-major order: index i*n + j) with the
    sampler ``backend`` (:data:`BACKENDS`; default the reference ``hf``).

    ``batch_size`` bounds the number of sequences decoded at once (default: all; ``hf`` only).
    ``stop``: strings that end a completion early (``hf`` only; the other backends decode to EOS
    or ``max_new_tokens``, and callers cut at the stop strings either way)."""
    extra = {"stop": tuple(stop)} if stop and backend == "hf" else {}
    return get_sampler(backend)(model, tokenizer, prompts, n=n, max_new_tokens=max_new_tokens,
                                temperature=temperature, top_p=top_p, greedy=greedy, seed=seed,
                                batch_size=batch_size, offsets=offsets, **extra)
