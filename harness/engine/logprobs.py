"""Per-token log-probs from final hidden states, without a [rows, vocab] logits tensor for the whole batch.

``log pi(y | h) = h . W[y] / T - logsumexp(h W^T / T)`` for each row ``h`` of the hidden states
(``W``: the output embedding, [vocab, hidden]; ``T``: the sampling temperature). The plain
computation (:func:`full_logprobs`) forms the logits of every row at once: B x T x V floats per
micro-batch, several copies of them under autograd (the scaled logits, the softmax and the
gradient in backward). With SmolLM2's 49,152-token vocabulary that is 192 MiB per float32 copy for
8 rows of 128 tokens, and most of a GRPO step's memory.

:func:`chunked_logprobs` computes the same values ``LOGITS_CHUNK_BYTES`` of logits at a time: in
forward it keeps only each row's log-prob and logsumexp; in backward (:class:`ChunkedLogprobs`, a
``torch.autograd.Function`` that saves the hidden states, the weight, the targets and the
logsumexps, nothing of vocabulary size) it recomputes each chunk's logits and forms the gradient
of the logits ``g (onehot(y) - softmax) / T`` for that chunk only, from which the hidden states'
gradient (``dlogits W``) and the weight's (``dlogits^T h``, summed over chunks in float32 whatever
the weight's dtype: bfloat16 weights get a float32 sum, cast once at the end) follow. Logits and
sums are float32 (float64 for float64 weights, so that tests can check the maths exactly). A weight shared with the input embedding (tied, as SmolLM2's) needs
nothing special: autograd adds this gradient to the embedding's. Rows whose incoming gradient is
zero (padding, masked out by the loss) are skipped in backward: their contribution is zero.
Without autograd (``no_grad`` callers: reference and old-policy scoring) the chunks simply run.

:func:`token_logprobs_from_hidden` chooses: the plain path while the full logits would take at most
``FULL_LOGITS_MAX_BYTES`` (float32), the chunked one above. The quickstart's tiny model (a
character vocabulary of 100 symbols) never comes near the threshold, so it always takes the
plain path, op for op the computation the learner always did: its numbers (the committed
quickstart reference, the pinned warm-up and start hashes) do not move. The chunked path agrees
with the plain one up to float rounding (different matmul shapes sum in other orders), not bit
for bit.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

# Above this many bytes of float32 logits (rows x vocab x 4) for one call, log-probs are computed in
# chunks. 64 MiB: the quickstart's tiny model (vocab 100) would need 167,772 rows in one micro-batch
# to reach it (it runs 128 x 40 = 5,120 at most), so it keeps the plain path; SmolLM2 (vocab 49,152)
# crosses it from 342 rows on, and the gsm8k_smollm2 recipe's micro-batch (8 x 128) holds 1,024.
FULL_LOGITS_MAX_BYTES = 64 * 2**20
# Float32 logits per chunk: rows per chunk = LOGITS_CHUNK_BYTES // (vocab x 4), at least 1
# (170 rows of SmolLM2's vocabulary). Several temporaries of this size live at once (logits,
# logsumexp's scratch, in backward the gradient of the logits in the weight's dtype).
LOGITS_CHUNK_BYTES = 32 * 2**20


def chunk_rows(vocab: int, chunk_bytes: int | None = None) -> int:
    """Rows per chunk for a vocabulary of ``vocab`` (``chunk_bytes`` default :data:`LOGITS_CHUNK_BYTES`)."""
    return max(1, (LOGITS_CHUNK_BYTES if chunk_bytes is None else chunk_bytes) // (4 * vocab))


def uses_chunks(rows: int, vocab: int) -> bool:
    """Whether :func:`token_logprobs_from_hidden` takes the chunked path for ``rows`` x ``vocab`` logits."""
    return rows * vocab * 4 > FULL_LOGITS_MAX_BYTES


def logprobs_from_logits(logits: torch.Tensor, targets: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """``log softmax(logits / T)`` at ``targets``: [..., vocab] -> [...] (the logits as given, e.g. float32)."""
    if temperature != 1.0:
        logits = logits / temperature
    lse = torch.logsumexp(logits, -1)
    return logits.gather(-1, targets[..., None]).squeeze(-1) - lse


def full_logprobs(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor,
                  temperature: float = 1.0) -> torch.Tensor:
    """The plain computation: every row's logits at once (float32), [..., vocab] -> [...]."""
    return logprobs_from_logits(F.linear(hidden, weight).float(), targets, temperature)


def _acc_dtype(weight: torch.Tensor) -> torch.dtype:
    """The dtype of the chunked path's logits, log-probs and weight gradient: float32, or
    float64 for float64 weights (which the exactness tests use)."""
    return torch.promote_types(weight.dtype, torch.float32)


def _chunk_logits(h: torch.Tensor, weight: torch.Tensor, temperature: float) -> torch.Tensor:
    """Logits / T of the rows ``h`` [rows, hidden] in :func:`_acc_dtype`: [rows, vocab]. The only
    place a vocabulary-sized tensor is made (forward and backward), one chunk at a time."""
    logits = F.linear(h, weight).to(_acc_dtype(weight))
    if temperature != 1.0:
        logits.div_(temperature)
    return logits


def _forward_chunks(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, temperature: float,
                    chunk: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Log-probs and logsumexps [N] (:func:`_acc_dtype`) of the rows of ``hidden`` [N, hidden]."""
    n = hidden.shape[0]
    lp = torch.empty(n, dtype=_acc_dtype(weight), device=hidden.device)
    lse = torch.empty_like(lp)
    for s in range(0, n, chunk):
        e = min(s + chunk, n)
        logits = _chunk_logits(hidden[s:e], weight, temperature)
        lse[s:e] = torch.logsumexp(logits, -1)
        lp[s:e] = logits.gather(-1, targets[s:e, None]).squeeze(-1) - lse[s:e]
    return lp, lse


class ChunkedLogprobs(torch.autograd.Function):
    """Log-probs of rows [N] from hidden [N, hidden], weight [vocab, hidden], targets [N] (long),
    with a backward that recomputes the logits chunk by chunk (see the module's docstring)."""

    @staticmethod
    def forward(ctx, hidden, weight, targets, temperature: float, chunk: int):
        with torch.no_grad():
            lp, lse = _forward_chunks(hidden, weight, targets, temperature, chunk)
        ctx.save_for_backward(hidden, weight, targets, lse)
        ctx.temperature, ctx.chunk = temperature, chunk
        return lp

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_lp):
        hidden, weight, targets, lse = ctx.saved_tensors
        T, chunk = ctx.temperature, ctx.chunk
        need_h, need_w = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        grad_h = torch.zeros_like(hidden) if need_h else None
        grad_w = torch.zeros(weight.shape, dtype=_acc_dtype(weight), device=weight.device) if need_w else None
        rows = grad_lp.ne(0).nonzero().squeeze(1)  # rows with zero gradient contribute nothing
        scale = grad_lp.to(lse.dtype) / T  # d lp / d logit = (onehot - softmax) / T
        for s in range(0, rows.numel(), chunk):
            idx = rows[s:s + chunk]
            h = hidden.index_select(0, idx)
            g = scale.index_select(0, idx)[:, None]
            dlogits = _chunk_logits(h, weight, T)
            dlogits.sub_(lse.index_select(0, idx)[:, None]).exp_().mul_(-g)  # -g softmax
            dlogits.scatter_add_(1, targets.index_select(0, idx)[:, None], g)  # + g onehot
            if need_h:
                grad_h.index_copy_(0, idx, (dlogits.to(weight.dtype) @ weight).to(hidden.dtype))
            if need_w:
                grad_w.addmm_(dlogits.t(), h.to(grad_w.dtype))
            del dlogits
        return grad_h, grad_w.to(weight.dtype) if need_w else None, None, None, None


def chunked_logprobs(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, temperature: float = 1.0,
                     chunk: int | None = None) -> torch.Tensor:
    """Log-probs [...] of ``targets`` [...] from ``hidden`` [..., hidden], at most ``chunk`` rows of
    logits at a time (default :func:`chunk_rows` of the vocabulary), in forward and backward."""
    lead = targets.shape
    h = hidden.reshape(-1, hidden.shape[-1])
    t = targets.reshape(-1)
    chunk = chunk or chunk_rows(weight.shape[0])
    if torch.is_grad_enabled() and (h.requires_grad or weight.requires_grad):
        lp = ChunkedLogprobs.apply(h, weight, t, float(temperature), int(chunk))
    else:
        lp = _forward_chunks(h, weight, t, float(temperature), int(chunk))[0]
    return lp.reshape(lead)


def token_logprobs_from_hidden(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor,
                               temperature: float = 1.0) -> torch.Tensor:
    """``log pi(target | hidden)`` [B, T] (float32; float64 for a float64 weight when chunked) from final hidden states [B, T, hidden] and the
    output embedding ``weight`` [vocab, hidden]: the plain computation (:func:`full_logprobs`,
    bit for bit what the learner always computed) while B x T x vocab float32 logits fit in
    :data:`FULL_LOGITS_MAX_BYTES`, else :func:`chunked_logprobs` (equal up to float rounding)."""
    if not uses_chunks(targets.numel(), weight.shape[0]):
        return full_logprobs(hidden, weight, targets, temperature)
    return chunked_logprobs(hidden, weight, targets, temperature)
