"""Character tokenizer round-trip and the sampler's log-probs / masks / determinism."""
import pytest
import torch
from transformers import AutoTokenizer

from harness.config.schema import ModelConfig
from harness.engine.learner import make_batch, token_logprobs
from harness.engine.models import build_char_tokenizer, build_tiny_model, load_policy, save_policy
from harness.engine.sampling import char_to_token_index, sample, token_end_offsets
from harness.rundir.layout import RunFileError


def test_char_tokenizer_round_trip(tmp_path):
    tok = build_char_tokenizer()
    text = "Q:3+4*2-5\nA:4*2=8;3+8=11;#6"
    ids = tok(text)["input_ids"]
    assert ids[0] == tok.bos_token_id and len(ids) == len(text) + 1
    assert tok.decode(ids, skip_special_tokens=True) == text
    tok.save_pretrained(tmp_path)
    tok2 = AutoTokenizer.from_pretrained(tmp_path)
    assert tok2(text)["input_ids"] == ids
    assert (tok2.pad_token_id, tok2.bos_token_id, tok2.eos_token_id, tok2.unk_token_id) == (0, 1, 2, 3)
    assert tok2.decode(tok2("héllo", add_special_tokens=False)["input_ids"]) == "h<unk>llo"
    batch = tok2(["Q:1", "Q:123"], padding=True)
    assert batch["input_ids"][0][:2] == [0, 0] and batch["attention_mask"][0] == [0, 0, 1, 1, 1, 1]


def test_model_save_load_round_trip(tmp_path):
    tok = build_char_tokenizer()
    m = build_tiny_model(ModelConfig(hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64), tok)
    save_policy(m, tok, tmp_path / "p")
    m2, tok2 = load_policy(str(tmp_path / "p"))
    x = torch.tensor([tok("Q:1+2")["input_ids"]])
    with torch.no_grad():
        assert torch.allclose(m(x).logits, m2(x).logits)


def test_sampler_logprobs_match_full_forward_and_masks():
    torch.manual_seed(0)
    tok = build_char_tokenizer()
    m = build_tiny_model(ModelConfig(hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64), tok)
    prompts = ["Q:3+4\nA:", "Q:33*4-2\nA:"]
    ro = sample(m, tok, prompts, n=3, max_new_tokens=12, seed=5)
    assert ro.num_sequences == 6 and ro.prompts[:3] == [prompts[0]] * 3
    lp = token_logprobs(m, make_batch(ro, "cpu")) * ro.completion_mask
    assert torch.allclose(lp, ro.logprobs, atol=1e-5)
    # mask covers tokens up to and including the first EOS; nothing after it
    eos = tok.eos_token_id
    for row, mask, fin in zip(ro.completion_ids.tolist(), ro.completion_mask.tolist(), ro.finished):
        L = int(sum(mask))
        assert mask == [1] * L + [0] * (len(mask) - L)
        assert fin == (eos in row[:L]) and (not fin or row[L - 1] == eos)
    again = sample(m, tok, prompts, n=3, max_new_tokens=12, seed=5)
    assert again.completions == ro.completions
    assert sample(m, tok, prompts, n=3, max_new_tokens=12, seed=6).completions != ro.completions
    chunked = sample(m, tok, prompts, n=3, max_new_tokens=12, seed=5, batch_size=3)
    assert len(chunked.completions) == 6


def test_greedy_is_argmax_and_token_offsets():
    tok = build_char_tokenizer()
    m = build_tiny_model(ModelConfig(hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64), tok)
    ro = sample(m, tok, ["Q:1\nA:"], n=2, max_new_tokens=5, greedy=True)
    assert ro.completions[0] == ro.completions[1]
    ids = tok("4*2=8;#8", add_special_tokens=False)["input_ids"]
    offs = token_end_offsets(tok, ids)
    assert offs == [1, 2, 3, 4, 5, 6, 7, 8]
    assert char_to_token_index(offs, 6) == 5 and char_to_token_index(offs, 99) == 7


def test_learner_adopts_warmup_second_moments(tmp_path):
    from algorithms.presets import resolve
    from harness.config.schema import load_config
    from harness.engine.learner import Learner
    from harness.engine.perf import PerfTracker

    tok = build_char_tokenizer()
    m = build_tiny_model(ModelConfig(hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64), tok)
    opt = torch.optim.AdamW(m.parameters(), lr=1e-3)
    m(torch.tensor([tok("Q:1+2")["input_ids"]])).logits.sum().backward()
    opt.step()
    torch.save(opt.state_dict(), tmp_path / "opt.pt")
    cfg = load_config(None, ["algorithm=rft"])
    learner = Learner(m, resolve(cfg.algorithm), cfg, "cpu", PerfTracker())
    learner.init_optimizer_from(str(tmp_path / "opt.pt"))
    for i, p in enumerate(m.parameters()):
        st = learner.opt.state[p]
        assert torch.equal(st["exp_avg_sq"], opt.state_dict()["state"][i]["exp_avg_sq"])
        assert not st["exp_avg"].any() and float(st["step"]) == 1.0
    bad = build_tiny_model(ModelConfig(hidden_size=64, num_layers=1, num_heads=2, intermediate_size=64), tok)
    with pytest.raises(RunFileError, match="does not match"):  # one line naming the file (exit 2), not a traceback
        Learner(bad, resolve(cfg.algorithm), cfg, "cpu", PerfTracker()).init_optimizer_from(str(tmp_path / "opt.pt"))


def test_sampled_pad_token_before_eos_stays_in_the_mask():
    """A policy may emit <pad> (id 0) mid-completion; it is a real token, so it stays masked in."""
    from types import SimpleNamespace

    tok = build_char_tokenizer()
    script = [tok.convert_tokens_to_ids("7"), tok.pad_token_id, tok.convert_tokens_to_ids("#"), tok.eos_token_id]

    class Scripted(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.zeros(1))
            self.t = 0

        def forward(self, input_ids, past_key_values=None, **kw):
            logits = torch.full((input_ids.shape[0], 1, len(tok)), -30.0)
            logits[:, 0, script[min(self.t, len(script) - 1)]] = 30.0
            self.t += 1
            return SimpleNamespace(logits=logits, past_key_values=past_key_values)

    ro = sample(Scripted(), tok, ["Q:1\nA:"], n=1, max_new_tokens=6, greedy=True, offsets=False)
    assert ro.completion_ids[0].tolist() == script
    assert ro.completion_mask[0].tolist() == [1, 1, 1, 1]
    assert ro.finished == [True] and ro.completions == ["7#"]


@pytest.mark.parametrize("greedy", [True, False])
def test_stop_strings_end_rows_early_without_changing_what_is_graded(greedy):
    """sample(stop=...): a row whose text reaches a stop string ends there (finished, its mask up to
    the token completing it), and every row's text up to its first stop string is the text decoding
    to max_new_tokens gives (evaluation protocols cut there either way); rows without it are unchanged."""
    torch.manual_seed(0)
    tok = build_char_tokenizer()
    m = build_tiny_model(ModelConfig(hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64), tok)
    prompts = ["Q:1+2", "Q:3*4-5", "Q:7"]
    kw = dict(n=2, max_new_tokens=40, greedy=greedy, temperature=1.0, seed=3)
    full = sample(m, tok, prompts, **kw)
    # a stop string from the middle of one row's completion, so at least that row stops early
    text0 = next(c for c in full.completions if len(c) >= 12)
    stop = text0[6:8]
    short = sample(m, tok, prompts, stop=[stop], **kw)
    lengths, full_lengths = short.completion_mask.sum(1).tolist(), full.completion_mask.sum(1).tolist()
    hit_any = False
    for i, (a, b) in enumerate(zip(full.completions, short.completions)):
        at = a.find(stop)
        if at < 0:  # never reaches the stop string: exactly as without it
            assert b == a and short.finished[i] == full.finished[i] and lengths[i] == full_lengths[i]
            continue
        hit_any = True
        assert b.find(stop) == at and b.endswith(stop) and a.startswith(b)  # ends with the token completing it
        assert short.finished[i] and lengths[i] == len(b) < full_lengths[i]  # one token per character here
        assert torch.equal(short.logprobs[i, :lengths[i]], full.logprobs[i, :lengths[i]])
        assert not short.logprobs[i, lengths[i]:].any()
    assert hit_any
