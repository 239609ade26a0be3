"""The ``vllm`` backend's own code (harness.engine.vllm_sampler) against a stand-in engine.

vLLM does not import here and no GPU was lent, so the engine itself is never run (the contract
tests in test_sampler_contract.py skip it). What is tested is everything of ours around it, with
a fake ``vllm`` module whose ``LLM`` loads the saved policy folder with transformers, receives
weights through ``apply_model(lambda m: m.load_weights(...))`` or, on an older vLLM without
``apply_model``, the driver worker's model runner, sleeps and wakes, and samples token by token
with a seeded generator, returning vLLM's output shape (``outputs[i].token_ids``, ``.logprobs``
as one ``{token: Logprob}`` dict per token):
- the engine is built once per policy, with sleep mode on where CUDA is, and is woken before and
  put to sleep (level 1) after every generation, so training gets the memory back;
- the policy's current weights are pushed before every generation: the rollouts' log-probs equal
  the learner's recomputation on the policy after an update, and greedy output changes with it;
- the conversion to Rollouts: prompt-major order, masks through the first EOS, ``finished``;
- log-probs at T != 1: the fake returns what vLLM documents for ``logprobs_mode`` (``raw_logprobs``,
  the default: log-softmax of the raw logits, before temperature and top-p; ``processed_logprobs``:
  after them), so rollouts carry the learner's post-temperature log-probs only if the engine was
  asked for processed ones (vLLM >= 0.10.2) or they were recomputed (older vLLM).
"""
import tempfile
from types import SimpleNamespace

import pytest
import torch
from transformers import AutoModelForCausalLM

from harness.config.schema import ModelConfig
from harness.engine import sampling, vllm_sampler
from harness.engine.learner import make_batch, token_logprobs
from harness.engine.models import build_char_tokenizer, build_tiny_model

PROMPTS = ["Q:3+4\nA:", "Q:33*4-2\nA:", "Q:7\nA:"]


class _Runner:
    def __init__(self, model):
        self.model = model


class FakeLLM:
    """Stand-in for ``vllm.LLM`` (see the module docstring); ``log`` records what happened."""
    instances: list = []

    def __init__(self, model, dtype, enforce_eager, gpu_memory_utilization, enable_sleep_mode, apply=True,
                 **engine_args):
        self.inner = AutoModelForCausalLM.from_pretrained(model).eval()
        self.inner.load_weights = lambda ws: self.log.append(("load", self.inner.load_state_dict(dict(ws))))
        self.kwargs = dict(dtype=dtype, enable_sleep_mode=enable_sleep_mode, **engine_args)
        self.logprobs_mode = engine_args.get("logprobs_mode", "raw_logprobs")  # vLLM's default
        self.log, self.asleep = [], False
        if not apply:  # an older vLLM: no LLM.apply_model, the model through the driver worker
            self.llm_engine = SimpleNamespace(model_executor=SimpleNamespace(
                driver_worker=SimpleNamespace(worker=SimpleNamespace(model_runner=_Runner(self.inner)))))
        FakeLLM.instances.append(self)

    def apply_model(self, fn):
        return fn(self.inner)

    def sleep(self, level):
        assert not self.asleep
        self.asleep = True
        self.log.append(("sleep", level))

    def wake_up(self):
        assert self.asleep
        self.asleep = False
        self.log.append(("wake",))

    @torch.no_grad()
    def generate(self, prompts, params, use_tqdm=False):
        assert not self.asleep, "generate on a sleeping engine"
        self.log.append(("generate", params.n))
        g = torch.Generator().manual_seed(params.seed)
        outs = []
        for p in prompts:
            seqs = []
            for _ in range(params.n):
                ids, toks, lps = list(p["prompt_token_ids"]), [], []
                for _ in range(params.max_tokens):
                    logits = self.inner(torch.tensor([ids])).logits[0, -1].float()
                    raw = torch.log_softmax(logits, -1)
                    if params.temperature == 0:
                        t = int(logits.argmax())
                        processed = raw
                    else:
                        processed = _top_p(torch.log_softmax(logits / params.temperature, -1), params.top_p)
                        t = int(torch.multinomial(processed.exp(), 1, generator=g))
                    lp = processed if self.logprobs_mode == "processed_logprobs" else raw
                    toks.append(t)
                    lps.append({t: SimpleNamespace(logprob=float(lp[t]))})
                    ids.append(t)
                    if t in params.stop_token_ids:
                        break
                seqs.append(SimpleNamespace(token_ids=toks, logprobs=lps))
            outs.append(SimpleNamespace(outputs=seqs))
        return outs


def _top_p(logp: torch.Tensor, top_p: float) -> torch.Tensor:
    """vLLM's nucleus cut: keep the most probable tokens whose mass reaches ``top_p``, renormalise."""
    if top_p >= 1.0:
        return logp
    p, order = logp.exp().sort(descending=True)
    drop = (p.cumsum(0) - p) >= top_p
    keep = torch.zeros_like(logp, dtype=torch.bool)
    keep[order[~drop]] = True
    return torch.log_softmax(logp.masked_fill(~keep, float("-inf")), -1)


@pytest.fixture
def fake_vllm(monkeypatch, tmp_path):
    FakeLLM.instances = []
    real_mkdtemp = tempfile.mkdtemp  # the engine's saved policy copies go under tmp_path, removed by pytest
    monkeypatch.setattr(vllm_sampler.tempfile, "mkdtemp",
                        lambda prefix=None, **kw: real_mkdtemp(prefix=prefix, dir=tmp_path))
    monkeypatch.setattr(vllm_sampler, "vllm", SimpleNamespace(LLM=FakeLLM, SamplingParams=SimpleNamespace,
                                                              __version__="0.11.0"))
    monkeypatch.setattr(vllm_sampler, "_ENGINES", {})
    monkeypatch.setattr(vllm_sampler, "_sleep_mode", lambda: True)
    return FakeLLM


def _tiny(seed=0):
    tok = build_char_tokenizer()
    return build_tiny_model(ModelConfig(hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64), tok,
                            seed=seed), tok


def _sample(model, tok, **kw):
    args = dict(n=2, max_new_tokens=40, temperature=1.0, top_p=1.0, greedy=False, seed=3, offsets=False)
    args.update(kw)
    return sampling._sample_from_lists(vllm_sampler.generate, model, tok, PROMPTS, **args)


def test_engine_built_once_woken_and_put_to_sleep_around_every_generation(fake_vllm):
    model, tok = _tiny()
    _sample(model, tok)
    _sample(model, tok)
    assert len(fake_vllm.instances) == 1
    llm = fake_vllm.instances[0]
    assert llm.kwargs == {"dtype": "float32", "enable_sleep_mode": True, "logprobs_mode": "processed_logprobs"}
    assert [e[0] for e in llm.log] == ["load", "generate", "sleep", "wake", "load", "generate", "sleep"]
    assert ("sleep", 1) in llm.log and llm.asleep


@pytest.mark.parametrize("apply", [True, False], ids=["apply_model", "driver_worker"])
def test_updated_weights_reach_the_engine_before_the_next_generation(fake_vllm, monkeypatch, apply):
    monkeypatch.setattr(vllm_sampler.vllm, "LLM", lambda **kw: FakeLLM(**kw, apply=apply))
    model, tok = _tiny(seed=1)
    before = _sample(model, tok, n=1, max_new_tokens=12, greedy=True)
    with torch.no_grad():
        model.model.norm.weight.mul_(-1.0)  # flips every logit: greedy now picks each step's argmin
    after = _sample(model, tok, n=1, max_new_tokens=12, greedy=True)
    assert after.completions != before.completions
    ro = _sample(model, tok)
    lp = token_logprobs(model, make_batch(ro, "cpu")) * ro.completion_mask
    assert (lp - ro.logprobs).abs().max().item() < 1e-4


def test_rollouts_from_engine_output(fake_vllm):
    model, tok = _tiny()
    ro = _sample(model, tok, n=3, max_new_tokens=60)
    assert ro.num_sequences == 9 and ro.prompts == [p for p in PROMPTS for _ in range(3)]
    eos = tok.eos_token_id
    for i in range(ro.num_sequences):
        L = int(ro.completion_mask[i].sum())
        ids = ro.completion_ids[i, :L].tolist()
        assert ro.finished[i] == (ids[-1] == eos) and eos not in ids[:-1]
        assert ro.completion_mask[i, L:].sum() == 0
    assert any(ro.finished) and not all(ro.finished)


@pytest.mark.parametrize("version,engine_mode", [("0.11.0", "processed_logprobs"), ("0.10.2", "processed_logprobs"),
                                                 ("0.10.1", "raw_logprobs"), ("0.9.2", "raw_logprobs")])
def test_rollout_logprobs_are_the_learners_at_temperature_08(fake_vllm, monkeypatch, version, engine_mode):
    """At T = 0.8 the rollouts' old-policy log-probs must be log softmax(logits / T), the learner's.
    vLLM >= 0.10.2 is asked for processed log-probs; an older one gives raw (pre-temperature) ones,
    which are not used: the sampler recomputes them. Without the fix (raw values passed through)
    the gap below is the size of the temperature's effect, far above the tolerance."""
    monkeypatch.setattr(vllm_sampler.vllm, "__version__", version)
    model, tok = _tiny(seed=2)
    ro = _sample(model, tok, temperature=0.8, max_new_tokens=16)
    assert fake_vllm.instances[0].logprobs_mode == engine_mode
    learner = token_logprobs(model, make_batch(ro, "cpu"), 0.8) * ro.completion_mask
    assert (learner - ro.logprobs).abs().max().item() < 1e-4
    raw = token_logprobs(model, make_batch(ro, "cpu"), 1.0) * ro.completion_mask
    assert (raw - learner).abs().max().item() > 0.05  # the raw values really are different


def test_the_fake_engine_returns_what_vllm_documents_for_each_mode(fake_vllm, tmp_path):
    """raw_logprobs: log softmax of raw logits; processed_logprobs: after temperature (and top-p)."""
    model, tok = _tiny(seed=2)
    model.save_pretrained(folder := str(tmp_path / "policy"))
    ids = tok(PROMPTS[:1])["input_ids"]
    params = SimpleNamespace(n=1, max_tokens=6, temperature=0.5, top_p=1.0, seed=1, logprobs=0,
                             stop_token_ids=[tok.eos_token_id])
    raw = FakeLLM(folder, "float32", True, 0.3, False).generate([{"prompt_token_ids": ids[0]}], params)
    proc = FakeLLM(folder, "float32", True, 0.3, False, logprobs_mode="processed_logprobs").generate(
        [{"prompt_token_ids": ids[0]}], params)
    out_r, out_p = raw[0].outputs[0], proc[0].outputs[0]
    assert out_r.token_ids == out_p.token_ids  # same seed: same tokens, only the reported values differ
    with torch.no_grad():
        seq = torch.tensor([ids[0] + out_r.token_ids])
        logits = model(seq).logits[0, len(ids[0]) - 1:-1].float()
    for j, t in enumerate(out_r.token_ids):
        assert abs(out_r.logprobs[j][t].logprob - float(torch.log_softmax(logits[j], -1)[t])) < 1e-5
        assert abs(out_p.logprobs[j][t].logprob - float(torch.log_softmax(logits[j] / 0.5, -1)[t])) < 1e-5


def test_engine_logprobs_are_the_behaviour_policy_through_the_pipeline(fake_vllm, monkeypatch, tmp_path):
    """Issue 46 item 6: the pipelined sampler (harness.train.pipeline) on the vllm backend. The stand-in engine
    serves in bfloat16 (as vLLM commonly does) for a float32 learner: the rollouts carry the engine's log-probs as
    the behaviour policy's, the learner keeps them apart from its own (proximal) ones, corrects for them and logs
    the mismatch, equal to the gap measured here directly."""
    import dataclasses

    from algorithms.presets import resolve
    from evals.catalog import get_task
    from harness.config.schema import load_config
    from harness.engine.learner import Learner
    from harness.engine.perf import PerfTracker
    from harness.train.pipeline import Pipeline

    def bf16_engine(**kw):
        llm = FakeLLM(**kw)
        llm.inner.to(torch.bfloat16)
        return llm
    monkeypatch.setattr(vllm_sampler.vllm, "LLM", bf16_engine)
    monkeypatch.setitem(sampling._SAMPLERS, "vllm", sampling.sample_vllm)  # vllm does not import here
    cfg = load_config(None, ["model.hidden_size=32", "model.num_layers=2", "model.num_heads=2",
                             "model.intermediate_size=64", "train.staleness=1", "sampling.max_new_tokens=12",
                             "train.prompts_per_step=3", "sampling.samples_per_prompt=4", "task.min_ops=1",
                             "task.max_ops=1", "algorithm.correction=token_tis", "algorithm.correction_cap=1.0003",
                             f"output_dir={tmp_path}"])
    cfg = dataclasses.replace(cfg, sampling=dataclasses.replace(cfg.sampling, backend="vllm"))  # past its rule
    model, tok = _tiny(seed=2)
    task = get_task(cfg.task)
    task.bind_tokenizer(tok)
    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0] * 3)
    pipe = Pipeline(cfg, task, tok, model, lambda t, reps, ro, prm: (rewards, []))
    try:
        pipe.start(0, model, 0)
        drawn = pipe.take(0)
    finally:
        pipe.close()
    ro, mask = drawn.draw.rollouts, drawn.draw.rollouts.completion_mask.bool()
    assert len(fake_vllm.instances) == 1 and next(fake_vllm.instances[0].inner.parameters()).dtype == torch.bfloat16
    learner_lp = token_logprobs(model, make_batch(ro, "cpu"))
    gap = (learner_lp - ro.logprobs)[mask].detach().double()
    assert gap.abs().mean().item() > 1e-4  # a real mismatch: bf16 engine, float32 learner (float32: ~1e-7)
    learner = Learner(model, resolve(cfg.algorithm), cfg, "cpu", PerfTracker())
    m = learner.step(ro, rewards, [], 0, staleness=0)
    assert m["offpolicy/staleness"] == 0
    assert m["offpolicy/logp_abs_diff"] == pytest.approx(gap.abs().mean().item(), rel=1e-3)
    assert m["offpolicy/mismatch_kl"] == pytest.approx((gap.expm1() - gap).mean().item(), rel=1e-3)
    assert m["offpolicy/truncated_frac"] == pytest.approx((gap.exp() > 1.0003).float().mean().item(), abs=1e-6)
    assert m["offpolicy/truncated_frac"] > 0
