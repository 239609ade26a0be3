"""A lean forward pass for Llama-architecture models (the built-in tiny model, SmolLM2, Llama).

Same parameters, same math as ``transformers``' ``LlamaForCausalLM`` (RMSNorm, rotary
embeddings, grouped-query SDPA attention, SwiGLU MLP); what it leaves out is the machinery
a small model pays for on every call (module dispatch, mask factories, cache objects,
output dataclasses). Two shapes of work, both used by the sampler and the learner:

- ``decode_state`` / ``prefill`` / ``decode_step``: batched sampling with a preallocated
  KV cache written in place (no per-token ``torch.cat``), fused QKV and gate/up weights
  (one matmul each instead of three and two), rotary tables computed once.
- ``completion_hidden``: the training / scoring forward over ``[prompt | completion]``
  rows that computes every *distinct* prompt once. A GRPO batch holds each prompt G times;
  the prompt's positions attend only to the prompt, so their keys and values are the same in
  all G rows. The prompt part runs on the unique prompts, its keys/values are gathered back
  to the rows, and the completion part attends to them. Exact up to float rounding;
  gradients reach the prompt computation through the gathered keys/values. Large batches under
  autograd keep only each layer's matmul and attention outputs and recompute the cheap ops
  between them (norms, rotary, SiLU, residual adds, copies) in backward (``checkpoint_layers``,
  ``RECOMPUTE``): no matmul is done twice, about half the memory of keeping everything, same bits.
  Under a memory budget (``RECOMPUTE_BUDGET_BYTES``, ``recompute_plan``) the first layers keep only
  their input and are recomputed whole, as few as fit: same bits again, their matmuls done twice.

``supported(model)`` says whether a model can take this path: a plain ``LlamaForCausalLM``
(or its ``LlamaModel`` decoder) with static rotary frequencies, no attention / MLP biases,
SiLU, no attention dropout, and parameters that are not partitioned (DeepSpeed ZeRO-3) or
wrapped (DDP, whose gradient hooks need its own forward). Anything else keeps the
``transformers`` forward; callers check ``supported`` and fall back. The environment variable
``HARNESS_FAST_FORWARD=0`` (or the ``disabled()`` context) turns the path off everywhere.
"""
from __future__ import annotations

import contextlib
import functools
import os
from dataclasses import dataclass

import torch
import torch.nn.functional as F
import torch.utils.checkpoint

from harness.engine.heap import release_freed_heap

_STATIC_ROPE = ("default", "linear", "llama3")


def _decoder(model):
    return model.model if hasattr(model, "lm_head") else model


def _unwrap(model):
    """(the plain Llama model under ``model``, whether its LoRA adapters count): a PEFT-wrapped policy
    (adapters on) or the reference view of one (:class:`harness.engine.lora.AdapterOffView`: off) reaches
    the ``LlamaForCausalLM`` it wraps; any other model is itself."""
    if getattr(model, "adapters_off", False):
        return _unwrap(model.policy)[0], False
    if hasattr(model, "peft_config") and hasattr(model, "get_base_model"):
        return model.get_base_model(), True
    return model, True


_enabled = os.environ.get("HARNESS_FAST_FORWARD", "1") != "0"


@contextlib.contextmanager
def disabled():
    """Within this context every model takes the ``transformers`` forward."""
    global _enabled
    prev, _enabled = _enabled, False
    try:
        yield
    finally:
        _enabled = prev


def supported(model) -> bool:
    if not _enabled:
        return False
    try:
        from transformers import LlamaForCausalLM, LlamaModel
    except ImportError:  # pragma: no cover
        return False
    model, _ = _unwrap(model)
    if type(model) not in (LlamaForCausalLM, LlamaModel):
        return False
    c = model.config
    if getattr(c, "attention_bias", False) or getattr(c, "mlp_bias", False) or c.hidden_act != "silu":
        return False
    if float(getattr(c, "attention_dropout", 0.0) or 0.0) != 0.0:
        return False
    rot = getattr(_decoder(model), "rotary_emb", None)
    if rot is None or getattr(rot, "rope_type", "default") not in _STATIC_ROPE:
        return False
    # ZeRO-3 leaves empty placeholders in .data; quantised weights are not plain tensors
    return all(p.numel() > 0 and not hasattr(p, "ds_id") and type(p) is torch.nn.Parameter
               for p in model.parameters()) and all(_plain_lora(m) for m in model.modules() if hasattr(m, "lora_A"))


def _plain_lora(m) -> bool:
    """A PEFT LoRA layer this path computes as PEFT does: a linear layer, not merged, at most one active
    adapter, without dropout, DoRA or a bias of its own."""
    active = [a for a in m.active_adapters if a in m.lora_A]
    return (hasattr(m, "base_layer") and isinstance(m.base_layer, torch.nn.Linear) and not m.merged
            and len(active) <= 1 and all(isinstance(m.lora_dropout[a], torch.nn.Identity)
                                         and not m.use_dora.get(a, False) and m.lora_A[a].bias is None
                                         and m.lora_B[a].bias is None for a in active))


@dataclass
class _Dims:
    heads: int
    kv_heads: int
    head_dim: int
    eps: float


def _dims(dec) -> _Dims:
    c = dec.config
    heads = c.num_attention_heads
    return _Dims(heads, getattr(c, "num_key_value_heads", None) or heads,
                 getattr(c, "head_dim", None) or c.hidden_size // heads, c.rms_norm_eps)


def _rms(x, w, eps):
    if x.dtype == torch.float32:
        return F.rms_norm(x, (x.shape[-1],), w, eps)
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return w * h.to(x.dtype)


def _rope_tables(dec, position_ids, dtype):
    """cos, signed sin: [B, L, head_dim]. cos and sin as ``LlamaRotaryEmbedding.forward`` computes them;
    the first half of sin negated, for :func:`_rotate`."""
    rot = dec.rotary_emb
    freqs = position_ids[..., None].float() * rot.inv_freq.to(device=position_ids.device, dtype=torch.float)
    emb = torch.cat((freqs, freqs), dim=-1)
    cos, sin = (emb.cos() * rot.attention_scaling).to(dtype), (emb.sin() * rot.attention_scaling).to(dtype)
    half = sin.shape[-1] // 2
    return cos, torch.cat((-sin[..., :half], sin[..., half:]), dim=-1)


def _rotate(x, cos, sin_signed):
    """Rotary embedding on the last axis of ``x``: ``x * cos + rotate_half(x) * sin`` (as ``transformers``'
    ``apply_rotary_pos_emb``) with ``rotate_half(x) * sin = cat(-x2 * s1, x1 * s2) = roll(x) * cat(-s1, s2)``:
    negating a factor negates the product exactly, so these are the same bits, without the negation and with a
    backward of one roll instead of two slices' zero-filled gradients and their sum. cos and the signed sin
    (:func:`_rope_tables`) broadcast against ``x``."""
    return x * cos + x.roll(x.shape[-1] // 2, -1) * sin_signed


def _prompt_attn_mask(mask):
    """[N, 1, P, P] (True = attend) for left-padded prompts (``mask`` bool [N, P]): causal over
    real tokens; a padded query attends to itself (its output is never read), so that no row
    is fully masked."""
    P = mask.shape[1]
    causal = torch.tril(torch.ones(P, P, dtype=torch.bool, device=mask.device))
    return ((causal[None] & mask[:, None, :]) | torch.eye(P, dtype=torch.bool, device=mask.device)[None])[:, None]


def _attend(q, k, v, mask, d: _Dims):
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=d.kv_heads != d.heads)


# Fusing the q/k/v and gate/up weights (one matmul instead of three and two) pays where the
# number of ops is what costs: small models. The concatenated copy costs memory in proportion to
# the model (under autograd it is also held for backward and gets a gradient of its own), so only
# models up to this many decoder-layer parameters are fused.
FUSE_MAX_PARAMS = 4_000_000


def _fuse(dec, limit: int) -> bool:
    return sum(p.numel() for p in dec.layers.parameters()) <= limit


@dataclass(frozen=True)
class _Lora:
    """The weights of a LoRA-adapted linear layer (PEFT's ``lora.Linear``): ``x W^T + scale (x A^T) B^T``."""
    weight: torch.Tensor
    a: torch.Tensor
    b: torch.Tensor
    scale: float


def _weight(mod, lora: bool, merge: bool):
    """The weight linear layer ``mod`` computes with: its own; for a PEFT LoRA layer whose adapter counts
    (``lora``, and not switched off by ``disable_adapter()``), a :class:`_Lora` or, with ``merge`` (decoding,
    no gradient), ``W + delta`` merged once as PEFT's ``get_delta_weight`` forms it."""
    if not hasattr(mod, "base_layer"):
        return mod.weight
    w = mod.base_layer.weight
    active = [a for a in mod.active_adapters if a in mod.lora_A]
    if not lora or mod.disable_adapters or not active:
        return w
    if merge:
        with torch.no_grad():
            return w + mod.get_delta_weight(active[0])
    return _Lora(w, mod.lora_A[active[0]].weight, mod.lora_B[active[0]].weight, mod.scaling[active[0]])


def _linear(x, w):
    """``F.linear(x, w)``; a :class:`_Lora` adds its low-rank term in PEFT's order."""
    if isinstance(w, _Lora):
        return F.linear(x, w.weight) + F.linear(F.linear(x, w.a), w.b) * w.scale
    return F.linear(x, w)


def _fused(ws: tuple):
    """``ws`` as one weight, concatenated along the output axis: plain tensors into one tensor; LoRA weights
    of one scale into one :class:`_Lora` (bases concatenated, A stacked, B block-diagonal: the zero blocks add
    exact zeros); ``ws`` itself (unfused) when plain and LoRA weights are mixed."""
    loras = [isinstance(t, _Lora) for t in ws]
    if not any(loras):
        return torch.cat(ws, 0)
    if not all(loras) or len({t.scale for t in ws}) > 1:
        return ws
    return _Lora(torch.cat([t.weight for t in ws], 0), torch.cat([t.a for t in ws], 0),
                 torch.block_diag(*[t.b for t in ws]), ws[0].scale)


def _weights(layer, fuse: bool, lora: bool = True, merge: bool = False):
    """(input norm, W_qkv, W_o, post norm, W_gate|up, W_down) of a decoder layer; W_qkv and
    W_gate|up fused (:func:`_fused`) when ``fuse``, tuples of the module's weights otherwise
    (:func:`_weight`: ``lora``, ``merge``)."""
    a, m = layer.self_attn, layer.mlp
    w = functools.partial(_weight, lora=lora, merge=merge)
    qkv = (w(a.q_proj), w(a.k_proj), w(a.v_proj))
    gu = (w(m.gate_proj), w(m.up_proj))
    if fuse:
        qkv, gu = _fused(qkv), _fused(gu)
    return layer.input_layernorm.weight, qkv, w(a.o_proj), layer.post_attention_layernorm.weight, gu, \
        w(m.down_proj)


def _proj_qkv(x, w):
    """[..., (heads + 2 kv_heads) * head_dim]: one fused matmul, or three concatenated."""
    if isinstance(w, tuple):
        return torch.cat([_linear(x, wi) for wi in w], -1)
    return _linear(x, w)


def _mlp(x, wgu, wdown):
    if isinstance(wgu, tuple):
        g, u = _linear(x, wgu[0]), _linear(x, wgu[1])
    else:
        g, u = _linear(x, wgu).chunk(2, -1)
    return _linear(F.silu(g) * u, wdown)


def _rope_qkv(qkv, cos, sin, d: _Dims, pad=None):
    """Split a fused projection [..., (heads + 2 kv_heads) * head_dim] into rotated q
    [..., heads, d], rotated k [..., kv_heads, d] and v [..., kv_heads, d]; q and k are
    rotated together (cos/sin broadcast over the head axis); ``pad``, when given, maps the rotated q|k and v to
    another layout before they are split. Split, not sliced: in backward the parts'
    gradients are concatenated once, where slices would each be a zero-filled copy, summed."""
    qk, v = qkv.split([(d.heads + d.kv_heads) * d.head_dim, d.kv_heads * d.head_dim], -1)
    qk = _rotate(qk.unflatten(-1, (d.heads + d.kv_heads, d.head_dim)), cos, sin)
    if pad is not None:  # packed positions -> the padded layout (_padded)
        qk, v = pad(qk), pad(v)
    q, k = qk.split([d.heads, d.kv_heads], -2)
    return q, k, v.unflatten(-1, (d.kv_heads, d.head_dim))


@dataclass(frozen=True)
class _Shared:
    """What every layer of :func:`completion_hidden` reads besides its own weights and inputs."""
    d: "_Dims"
    fuse: bool
    cos_p: torch.Tensor
    sin_p: torch.Tensor
    m_p: torch.Tensor
    cos_c: torch.Tensor
    sin_c: torch.Tensor
    m_c: torch.Tensor
    flat: "torch.Tensor | None"  # packed positions in the [B * T] layout; None: all of them (no padding)
    inv: torch.Tensor
    B: int
    T: int
    lora: bool = True  # LoRA adapters count (False: the reference view of a LoRA policy, the frozen base)


def _padded(x, s: _Shared) -> torch.Tensor:
    """Packed completion positions ``x`` [N, ...] in the padded layout [B, T, ...], zeros at the padding: a view
    when nothing is padded (``s.flat`` None)."""
    if s.flat is None:
        return x.view(s.B, s.T, *x.shape[1:])
    return x.new_zeros(s.B * s.T, *x.shape[1:]).index_copy_(0, s.flat, x).view(s.B, s.T, *x.shape[1:])


def _packing(need: torch.Tensor) -> "torch.Tensor | None":
    """The packed completion positions in the [B * T] layout (``need``: [B, T], the positions whose next token is
    real), or None when that is all of them: no padding, so the packed layout is the padded one."""
    flat = need.reshape(-1).nonzero().squeeze(1)
    return None if flat.numel() == need.numel() else flat


def _packed(x, flat: "torch.Tensor | None") -> torch.Tensor:
    """[B * T, ...] -> the packed positions ``flat`` [N, ...] (``x`` itself when nothing is padded: None)."""
    return x if flat is None else x.index_select(0, flat)


def _layer(layer, xp, xc, s: _Shared):
    """One decoder layer of :func:`completion_hidden`: the distinct prompts ``xp`` [U, P, H], then the
    packed completion positions ``xc`` [N, H] (None when there are none), which attend to their
    rows' prompt keys/values and to themselves."""
    d = s.d
    w_in, wqkv, wo, w_post, wgu, wdown = _weights(layer, s.fuse, s.lora)
    U, P = xp.shape[:2]
    qp, kp, vp = (t.transpose(1, 2) for t in _rope_qkv(_proj_qkv(_rms(xp, w_in, d.eps), wqkv), s.cos_p, s.sin_p, d))
    op = _attend(qp, kp, vp, s.m_p, d)
    xp = xp + _linear(op.transpose(1, 2).reshape(U, P, -1), wo)
    xp = xp + _mlp(_rms(xp, w_post, d.eps), wgu, wdown)
    if xc is None:
        return xp, None
    # rotated where packed, then padded to [B, T, .] (views when nothing is padded): attention runs on the padded layout
    qc, kc, vc = (t.transpose(1, 2) for t in _rope_qkv(_proj_qkv(_rms(xc, w_in, d.eps), wqkv), s.cos_c, s.sin_c, d,
                                                        pad=functools.partial(_padded, s=s)))
    k_all = torch.cat([kp.index_select(0, s.inv), kc], 2)
    v_all = torch.cat([vp.index_select(0, s.inv), vc], 2)
    oc = _packed(_attend(qc, k_all, v_all, s.m_c, d).transpose(1, 2).reshape(s.B * s.T, -1), s.flat)
    xc = xc + _linear(oc, wo)
    xc = xc + _mlp(_rms(xc, w_post, d.eps), wgu, wdown)
    return xp, xc


# Under autograd, a decoder layer keeps about this many floats per token for backward, in units of
# the hidden size and the MLP's width (norm outputs, q/k/v, attention output, residuals; gate, up,
# their product): an estimate, used only to decide whether to recompute (see checkpoint_layers).
_SAVED_PER_TOKEN = (10, 4)  # x hidden, x intermediate
# (A layer recomputed selectively keeps its input, q, attention output and output projection: 4 x hidden;
# k and v: 2 x the key/value width; gate and up: 2 x intermediate. Fully: its input, 1 x hidden. See
# _saved_bytes and recompute_plan.)
# Above this many estimated bytes of saved activations for one forward, each layer is recomputed in
# backward (torch.utils.checkpoint), selectively by default (RECOMPUTE below): the cheap ops' outputs
# are dropped and recomputed, the matmuls' kept. SmolLM2-135M at the gsm8k_smollm2 recipe's micro-batch (8 rows
# of 128 tokens: 30 layers, hidden 576, MLP 1,536) is estimated at 1.4 GiB and recomputes; the
# quickstart's tiny model (0.87M parameters) estimates at most 27 MiB and never does.
CHECKPOINT_MIN_BYTES = 512 * 2**20

# What a recomputed layer keeps (when checkpoint_layers says so). "selective" (the default): the outputs of
# its matmuls and of attention (and its input), so backward recomputes only the cheap ops between them (norms,
# rotary, SiLU x up, residual adds, the packed layout's copies) and does no matmul twice; the completion
# positions' down projection is not kept either (nothing in backward reads it, and recomputation stops before
# it). "full": only the layer's input, the whole layer (all but that last matmul) recomputed: the least memory,
# about 0.77 more of a forward's matmul FLOPs at the 27.3M bench shape. Both replay the same ops on the same
# inputs, so values and gradients are the same bits as without recomputation
# (tests/harness/engine/test_fastlm_recompute.py).
RECOMPUTE = "selective"

# The memory budget of selective recomputation: when every layer recomputed selectively is estimated
# (_saved_bytes) above this many bytes of saved activations for one forward, the first layers are
# recomputed fully instead, as few as bring the estimate within it (all of them if none does;
# recompute_plan). Each such layer saves about (3 hidden + 2 key/value width + 2 MLP) floats per token
# and does its matmuls again in backward; the bits do not change. 1,200 MiB, with the freed heap handed back
# (harness.engine.heap.RELEASE_FREED_HEAP, on by default): the 27.3M bench's 64-row micro-batch (8 layers,
# ~8,200 positions; selectively 1.5 GiB estimated) recomputes 2 of its 8 layers fully, and its whole step
# peaks at 2,772-2,802 MiB RSS (under 3 GB) where the earlier 512 MiB budget without the trim (6 layers full)
# peaked at 2,752-2,870 MiB for 365 GFLOP more per step; three alternating pairs on a quiet 2-core machine:
# 1.4% and 3.3% faster in the two uncontended ones; SmolLM2's recipe step (30 layers) peaks 210 MiB lower,
# every layer selective (bench/README.md, issue 29.2e). float("inf"): no budget (every layer selective, the
# least FLOPs).
RECOMPUTE_BUDGET_BYTES = 1200 * 2**20

# ops whose outputs a selectively recomputed layer keeps: matmuls and fused attention kernels
_SAVE_OPS = tuple(op for op in (
    getattr(torch.ops.aten, name, None) for name in (
        "mm", "addmm", "bmm", "baddbmm", "_scaled_dot_product_flash_attention_for_cpu",
        "_scaled_dot_product_flash_attention", "_scaled_dot_product_efficient_attention",
        "_scaled_dot_product_cudnn_attention", "_scaled_dot_product_fused_attention_overrideable"))
    if op is not None)


def _lora_up_ptrs(layer) -> frozenset:
    """The storage addresses of a decoder layer's LoRA B matrices (none without LoRA)."""
    return frozenset(m.lora_B[a].weight.data_ptr() for m in layer.modules() if hasattr(m, "lora_B") for a in m.lora_B)


def _selective_context(wdown: torch.Tensor, downs: int, cheap: frozenset = frozenset()):
    """``context_fn`` for :func:`torch.utils.checkpoint.checkpoint`: keep the outputs of ``_SAVE_OPS``
    except every ``downs``-th down projection (a matmul against ``wdown``): the layer's last matmul,
    whose output only the residual add after it reads (the next layer keeps its own input); and except
    the matmuls against ``cheap`` (LoRA's B: rank-r inputs, kept as the A products they start from), which
    are recomputed rather than holding a second output the size of the base projection's."""
    ptr = wdown.data_ptr()
    seen = [0, 0]  # down projections met in forward, in recomputation
    save, recompute = (torch.utils.checkpoint.CheckpointPolicy.MUST_SAVE,
                       torch.utils.checkpoint.CheckpointPolicy.PREFER_RECOMPUTE)

    def policy(ctx, op, *args, **kwargs):
        if op.overloadpacket not in _SAVE_OPS:
            return recompute
        if cheap and op.overloadpacket is torch.ops.aten.mm and args[1].data_ptr() in cheap:
            return recompute
        if op.overloadpacket is torch.ops.aten.mm and args[1].data_ptr() == ptr:
            seen[ctx.is_recompute] += 1
            if seen[ctx.is_recompute] % downs == 0:
                return recompute
        return save

    return torch.utils.checkpoint.create_selective_checkpoint_contexts(policy)


def _saved_bytes(dec, tokens: int, how: str) -> int:
    """Estimated bytes one layer keeps for backward at ``tokens`` positions when it is recomputed ``how``
    (``"keep"``: not recomputed, ``"selective"``, ``"full"``; see the comments above)."""
    cfg = dec.config
    hidden, inter = cfg.hidden_size, cfg.intermediate_size
    if how == "keep":
        floats = _SAVED_PER_TOKEN[0] * hidden + _SAVED_PER_TOKEN[1] * inter
    elif how == "selective":
        d = _dims(dec)
        floats = 4 * hidden + 2 * d.kv_heads * d.head_dim + 2 * inter
    else:
        floats = hidden
    return tokens * floats * dec.embed_tokens.weight.element_size()


def checkpoint_layers(dec, tokens: int) -> bool:
    """Whether :func:`completion_hidden` recomputes each layer in backward for ``tokens`` positions
    (distinct-prompt plus packed completion positions): when the estimated saved activations exceed
    ``CHECKPOINT_MIN_BYTES``. The values and gradients are the same either way, bit for bit."""
    return dec.config.num_hidden_layers * _saved_bytes(dec, tokens, "keep") > CHECKPOINT_MIN_BYTES


def recompute_plan(dec, tokens: int) -> tuple[str, ...]:
    """What each layer of :func:`completion_hidden` keeps for backward under autograd, for ``tokens``
    positions: ``"keep"`` (everything; nothing recomputed), ``"selective"`` or ``"full"``. Nothing is
    recomputed unless :func:`checkpoint_layers` says so; then every layer is recomputed the ``RECOMPUTE``
    way, except that ``"selective"``, where its estimate for all layers exceeds ``RECOMPUTE_BUDGET_BYTES``,
    recomputes the first ``k`` layers fully, ``k`` the least that brings the estimate within the budget
    (all layers where none does). Every plan gives the same values and gradients, bit for bit."""
    L = dec.config.num_hidden_layers
    if not checkpoint_layers(dec, tokens):
        return ("keep",) * L
    if RECOMPUTE not in ("selective", "full"):
        raise ValueError(f"fastlm.RECOMPUTE: {RECOMPUTE!r}, expected 'selective' or 'full'")
    if RECOMPUTE == "full":
        return ("full",) * L
    sel, full = _saved_bytes(dec, tokens, "selective"), _saved_bytes(dec, tokens, "full")
    k = 0
    while k < L and k * full + (L - k) * sel > RECOMPUTE_BUDGET_BYTES:
        k += 1
    return ("full",) * k + ("selective",) * (L - k)


def _release_after_backward(grad):
    """Tensor hook on a recomputed layer's input: once the layer's backward is done, its freed activations go
    back to the system (:func:`harness.engine.heap.release_freed_heap`). The gradient is not touched."""
    release_freed_heap()


# ----------------------------------------------------------------------------------------
# training / scoring forward with shared prompts

def completion_hidden(model, prompt_ids, prompt_mask, completion_ids, completion_mask) -> torch.Tensor:
    """Final-norm hidden states at the T positions that predict the completion tokens
    (the last prompt position, then completion positions 0..T-2): [B, T, hidden].

    Rows are ``[left-padded prompt | completion]`` as the sampler returns them
    (``completion_mask``: ones up to and including EOS, then zeros). Same values as a full
    forward with ``attention_mask = cat(prompt_mask, completion_mask)`` at every position
    that predicts a real token; the others hold zeros. Work is done only where it is needed:
    each distinct prompt once, and, of the completion, only the positions whose next token is
    real (packed for the per-token layers; attention runs on the padded layout). The last
    token of a completion is never an input: nothing reads its output or key/value. Under
    autograd, a batch whose saved activations would be large (:func:`checkpoint_layers`) keeps
    only each layer's input and matmul / attention outputs and recomputes the cheap ops in backward
    (``RECOMPUTE``), or, beyond ``RECOMPUTE_BUDGET_BYTES``, only the input of its first layers, recomputed
    whole (:func:`recompute_plan`): the same values and gradients. A PEFT LoRA model computes its
    adapters (:func:`_weight`); its reference view (adapters off) the base alone."""
    model, lora = _unwrap(model)
    dec = _decoder(model)
    d = _dims(dec)
    B, P = prompt_ids.shape
    T = completion_ids.shape[1] - 1  # completion positions that can be inputs
    dev = prompt_ids.device
    pmask = prompt_mask.bool()
    # distinct prompts (rows of ids and mask) -> computed once
    key = torch.cat([prompt_ids, pmask.long()], 1)
    uniq, inv = torch.unique(key, dim=0, return_inverse=True)
    U = uniq.shape[0]
    u_ids, u_mask = uniq[:, :P].contiguous(), uniq[:, P:].bool()
    u_pos = (u_mask.long().cumsum(-1) - 1).clamp_min(0)
    dtype = dec.embed_tokens.weight.dtype
    cos_p, sin_p = (t[:, :, None] for t in _rope_tables(dec, u_pos, dtype))  # [U, P, 1, d]
    m_p = _prompt_attn_mask(u_mask)  # [U, 1, P, P]
    # as nn.Embedding(padding_idx=...): no gradient into the pad row from inputs
    xp = F.embedding(u_ids, dec.embed_tokens.weight, dec.embed_tokens.padding_idx)
    xc = cos_c = sin_c = m_c = flat = None
    if T > 0:
        # input position t is needed iff token t+1 is real (the mask is a prefix of ones)
        need = completion_mask[:, 1:T + 1].bool()
        flat = _packing(need)
        c_pos = _packed((pmask.sum(1, keepdim=True) + torch.arange(T, device=dev)[None]).reshape(-1), flat)
        cos_c, sin_c = (t[0, :, None] for t in _rope_tables(dec, c_pos[None], dtype))  # [N, 1, d]
        causal_c = torch.tril(torch.ones(T, T, dtype=torch.bool, device=dev))
        m_c = torch.cat([pmask[:, None, :].expand(B, T, P), (causal_c[None] & need[:, None, :]) | torch.eye(
            T, dtype=torch.bool, device=dev)[None]], 2)[:, None]  # [B, 1, T, P+T]
        xc = F.embedding(_packed(completion_ids[:, :T].reshape(-1), flat), dec.embed_tokens.weight,
                         dec.embed_tokens.padding_idx)  # [N, H]
    fuse = _fuse(dec, FUSE_MAX_PARAMS)
    shared = _Shared(d, fuse, cos_p, sin_p, m_p, cos_c, sin_c, m_c, flat, inv, B, T, lora)
    # under autograd, a big enough batch keeps only each layer's input and matmul / attention outputs (or,
    # within a memory budget, only the input of some layers) and recomputes the rest in backward
    # (recompute_plan; same ops on the same inputs: the same bits)
    plan = (recompute_plan(dec, U * P + (0 if xc is None else xc.shape[0])) if torch.is_grad_enabled()
            else ("keep",) * len(dec.layers))
    for layer, how in zip(dec.layers, plan):
        if how != "keep" and xp.requires_grad:  # after this layer's backward (the gradient of its input)
            xp.register_hook(_release_after_backward)
        if how == "selective":
            ctx = functools.partial(_selective_context, layer.mlp.down_proj.weight, 1 if xc is None else 2,
                                    _lora_up_ptrs(layer) if lora else frozenset())
            xp, xc = torch.utils.checkpoint.checkpoint(_layer, layer, xp, xc, shared, use_reentrant=False,
                                                       context_fn=ctx)
        elif how == "full":
            xp, xc = torch.utils.checkpoint.checkpoint(_layer, layer, xp, xc, shared, use_reentrant=False)
        else:
            xp, xc = _layer(layer, xp, xc, shared)
        if how != "keep":
            release_freed_heap()
    h = xp[:, -1:].index_select(0, inv)
    if T > 0:
        h = torch.cat([h, _padded(xc, shared)], 1)
    return _rms(h, dec.norm.weight, d.eps)


def trimmed_length(completion_mask) -> int:
    """Columns of a completion batch that hold any real token (at least 1): the forward
    passes need not go further."""
    if completion_mask.shape[1] == 0:
        return 0
    return max(int(completion_mask.sum(1).max().item()), 1)


def rows_hidden(model, input_ids, attention_mask, num_completion: int) -> torch.Tensor:
    """``completion_hidden`` for rows laid out as the learner's batches are (prompt and
    completion concatenated, the last ``num_completion`` columns the completion), up to the
    longest completion only: [B, T', hidden] with T' = ``trimmed_length`` <= num_completion (the
    columns after it are padding in every row; callers pad their results back)."""
    P = input_ids.shape[1] - num_completion
    T = trimmed_length(attention_mask[:, P:])
    return completion_hidden(model, input_ids[:, :P], attention_mask[:, :P], input_ids[:, P:P + T],
                             attention_mask[:, P:P + T])


def completion_logits(model, prompt_ids, prompt_mask, completion_ids, completion_mask) -> torch.Tensor:
    """Logits predicting each completion token: [B, T, vocab]."""
    h = completion_hidden(model, prompt_ids, prompt_mask, completion_ids, completion_mask)
    return F.linear(h, _unwrap(model)[0].lm_head.weight)


# ----------------------------------------------------------------------------------------
# sampling: prefill + in-place KV cache decode

class DecodeState:
    """Fused weights, rotary tables and a preallocated KV cache for one batch of decoding."""

    def __init__(self, model, max_len: int):
        model, lora = _unwrap(model)  # LoRA adapters merged into the weights once for the batch (_weight)
        dec = _decoder(model)
        self.dec, self.d = dec, _dims(dec)
        self.lm_head = model.lm_head.weight
        self.embed = dec.embed_tokens.weight
        self.dtype = self.embed.dtype
        fuse = _fuse(dec, FUSE_MAX_PARAMS)
        self.layers = [_weights(layer, fuse, lora, merge=True) for layer in dec.layers]
        pos = torch.arange(max_len, device=self.embed.device)
        cos, sin = _rope_tables(dec, pos[None], self.dtype)
        self.cos, self.sin = cos[0], sin[0]  # [max_len, d]
        self.max_len = max_len
        self.k = self.v = None
        self.length = 0

    def prefill(self, ids, mask, repeat: int) -> torch.Tensor:
        """Run the prompts ``ids`` [N, P] (left-padded, ``mask``), allocate the cache for
        ``N * repeat`` rows (each prompt's keys/values copied ``repeat`` times, prompt-major)
        and return last-position logits [N, vocab]."""
        d = self.d
        N, P = ids.shape
        dev = ids.device
        m = mask.bool()
        pos = (m.long().cumsum(-1) - 1).clamp_min(0)
        cos, sin = self.cos[pos][:, :, None], self.sin[pos][:, :, None]  # [N, P, 1, d]
        attn = _prompt_attn_mask(m)
        B = N * repeat
        L = len(self.layers)
        # per layer [B * kv_heads, max_len, head_dim]: a decode step's attention is two
        # batched matmuls over a prefix view (SDPA's kernels are slow for one query)
        self.k = torch.empty((L, B * d.kv_heads, self.max_len, d.head_dim), dtype=self.dtype, device=dev)
        self.v = torch.empty_like(self.k)
        self.bias = torch.zeros((B, self.max_len), dtype=self.dtype, device=dev)  # additive key mask
        self.bias[:, :P].masked_fill_(~m.repeat_interleave(repeat, 0), float("-inf"))
        self.next_pos = pos[:, -1:].repeat_interleave(repeat, 0) + 1  # [B, 1]
        x = F.embedding(ids, self.embed)
        for i, (w_in, wqkv, wo, w_post, wgu, wdown) in enumerate(self.layers):
            q, k, v = (t.transpose(1, 2) for t in _rope_qkv(_proj_qkv(_rms(x, w_in, d.eps), wqkv), cos, sin, d))
            self.k[i, :, :P] = k.repeat_interleave(repeat, 0).reshape(B * d.kv_heads, P, d.head_dim)
            self.v[i, :, :P] = v.repeat_interleave(repeat, 0).reshape(B * d.kv_heads, P, d.head_dim)
            o = _attend(q, k, v, attn, d)
            x = x + F.linear(o.transpose(1, 2).reshape(N, P, -1), wo)  # merged: plain tensors
            x = x + _mlp(_rms(x, w_post, d.eps), wgu, wdown)
        self.length = P
        return F.linear(_rms(x[:, -1], self.dec.norm.weight, d.eps), self.lm_head)

    def step(self, tok) -> torch.Tensor:
        """Append one token per row ([B]); return next-token logits [B, vocab]."""
        d = self.d
        B = tok.shape[0]
        t = self.length
        if t >= self.max_len:
            raise RuntimeError(f"decode cache full ({self.max_len} positions)")
        groups = d.heads // d.kv_heads
        cos, sin = self.cos[self.next_pos], self.sin[self.next_pos]  # [B, 1, d]
        bias = self.bias[:, None, :t + 1]  # [B, 1, t+1]
        scale = d.head_dim ** -0.5
        x = F.embedding(tok, self.embed)  # [B, hidden]
        for i, (w_in, wqkv, wo, w_post, wgu, wdown) in enumerate(self.layers):
            q, k, v = _rope_qkv(_proj_qkv(_rms(x, w_in, d.eps), wqkv), cos, sin, d)  # [B, h, d]
            self.k[i, :, t].view(B, d.kv_heads, d.head_dim).copy_(k)  # written in place, no contiguous copy first
            self.v[i, :, t].view(B, d.kv_heads, d.head_dim).copy_(v)
            # query heads are ordered [kv_head, group] (as repeat_kv pairs them)
            s = torch.bmm(q.reshape(B * d.kv_heads, groups, d.head_dim), self.k[i, :, :t + 1].transpose(1, 2))
            p = torch.softmax(s.view(B, d.heads, t + 1) * scale + bias, -1)
            o = torch.bmm(p.view(B * d.kv_heads, groups, t + 1), self.v[i, :, :t + 1])
            x = x + F.linear(o.reshape(B, -1), wo)
            x = x + _mlp(_rms(x, w_post, d.eps), wgu, wdown)
        self.length = t + 1
        self.next_pos = self.next_pos + 1
        return F.linear(_rms(x, self.dec.norm.weight, d.eps), self.lm_head)

    def keep_rows(self, keep: torch.Tensor) -> None:
        """Drop every row but ``keep`` (indices into the current rows) from the cache."""
        kvh = self.d.kv_heads
        kv = (keep[:, None] * kvh + torch.arange(kvh, device=keep.device)[None]).reshape(-1)
        self.k = self.k.index_select(1, kv)
        self.v = self.v.index_select(1, kv)
        self.bias = self.bias.index_select(0, keep)
        self.next_pos = self.next_pos.index_select(0, keep)
