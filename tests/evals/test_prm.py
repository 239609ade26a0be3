"""Process reward models: rule-based (arith) and the Math-Shepherd-style causal-LM hook."""
import math
from types import SimpleNamespace

import pytest
import torch

from evals.arith import ArithTask
from evals.prm import CausalLMPRM, RuleBasedPRM, split_steps
from harness.engine.models import load_prm as make_prm
from evals.tasks import Problem, Task
from harness.engine.models import build_char_tokenizer


def test_split_steps_offsets():
    assert split_steps("4*2=8;3+8=11;#11") == [("4*2=8", 6), ("3+8=11", 13), ("#11", 16)]
    assert split_steps("a\n\nb\n") == [("a", 3), ("b", 5)]
    assert split_steps("") == []


def test_rule_based_prm_is_the_task_checker():
    task = ArithTask()
    prm = make_prm(None, task)
    assert isinstance(prm, RuleBasedPRM)
    p = task.make_problem("3+4*2-5")
    assert [s.reward for s in prm.step_rewards("4*2=8;3+8=12;12-5=7;#7", p)] == [1, 0, 1, 0]
    with pytest.raises(ValueError, match="no rule-based step checker"):
        RuleBasedPRM(Task())


def test_rule_based_prm_scores_skipped_work_and_bare_answers():
    """The PRM the trainer uses (algorithm.prm null) passes on the checker's scoring of skipped work."""
    task = ArithTask()
    prm = make_prm(None, task)
    p = task.make_problem("3+4*2-5")  # K = 3
    scored = lambda c, f=True: [(s.reward, s.end) for s in prm.step_rewards(c, p, f)]
    assert scored("4*2=8;3+8=11;11-5=6;#6") == [(1, 6), (1, 13), (1, 20), (1, 22)]
    assert scored("#6") == [(0, 2)] * 4                                  # outcome 0: no credit at all
    assert scored("4*2=8;#6") == [(1, 6), (0, 8), (0, 8), (0, 8)]        # two reductions skipped
    assert scored("4*2=8;3+8=11;11-", False) == [(1, 6), (1, 13), (0, 16), (0, 16)]  # truncated


class TagModel(torch.nn.Module):
    """Stub PRM: at the step-tag token, logit(good) - logit(bad) = 2 for the k-th tag when
    k is even and -1 when odd; elsewhere the opposite sign, so reading a wrong position shows."""

    def __init__(self, tag, good, bad, vocab):
        super().__init__()
        self.tag, self.good, self.bad, self.vocab = tag, good, bad, vocab
        self.w = torch.nn.Parameter(torch.zeros(1))

    def forward(self, input_ids):
        ids = input_ids[0]
        logits = torch.zeros(1, len(ids), self.vocab)
        k = 0
        for i, t in enumerate(ids.tolist()):
            if t == self.tag:
                logits[0, i, self.good] = 2.0 if k % 2 == 0 else -1.0
                k += 1
            else:
                logits[0, i, self.good] = -7.0
        return SimpleNamespace(logits=logits)


def test_causal_lm_prm_reads_the_tag_positions():
    tok = build_char_tokenizer()
    tag, good, bad = (tok(c, add_special_tokens=False)["input_ids"][0] for c in ("@", "+", "-"))
    prm = CausalLMPRM(good_token="+", bad_token="-", step_tag="@",
                      model=TagModel(tag, good, bad, len(tok)), tokenizer=tok)
    p = Problem(id="x", question="3+4*2", answer="11")
    out = prm.step_rewards("4*2=8;3+8=11;#11", p)
    sig = lambda x: 1 / (1 + math.exp(-x))
    assert [round(s.reward, 6) for s in out] == [round(sig(2), 6), round(sig(-1), 6), round(sig(2), 6)]
    assert [s.end for s in out] == [6, 13, 16]
    truncated = prm.step_rewards("4*2=8;3+8=11;#11", p, finished=False)
    assert truncated[-1].reward == 0.0 and truncated[0].reward == out[0].reward
    with pytest.raises(ValueError, match="one token"):
        CausalLMPRM(good_token="++", model=TagModel(tag, good, bad, len(tok)), tokenizer=tok)
