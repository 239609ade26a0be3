"""harness.engine.evaluate.evaluate(protocol=...): the chat protocol is today's evaluation, and
lighteval-5shot prompts, cuts and grades GSM8K as lighteval does (scripted sampler with hand-made
completions; the real sampler on the tiny model)."""
from types import SimpleNamespace

import pytest
import torch

from evals.catalog import get_task
from evals.protocols import ProtocolError
from evals.records import read_records
from harness.config.schema import ModelConfig, TaskConfig
from harness.engine.evaluate import evaluate
from harness.engine.models import build_char_tokenizer, build_tiny_model

# SmolLM2-135M-Instruct's chat template (tokenizer_config.json of the model, as the GGUF carries it)
SMOLLM2_TEMPLATE = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\n"
    "You are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}{% endif %}"
    "{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")


def scripted(calls, by_question):
    """A sampler answering each prompt with the (text, finished) of the first key found in the prompt's
    last question."""
    def sample(model, tokenizer, prompts, n=1, max_new_tokens=32, temperature=1.0, top_p=1.0, greedy=False,
               seed=0, batch_size=None):
        calls.append({"prompts": list(prompts), "max_new_tokens": max_new_tokens})
        texts, fin = [], []
        for p in prompts:
            last = p.rsplit("Question: ", 1)[-1]
            text, done = next(v for k, v in by_question.items() if k in last)
            texts += [text] * n
            fin += [done] * n
        mask = torch.ones(len(texts), 5, dtype=torch.long)
        return SimpleNamespace(completions=texts, finished=fin, completion_mask=mask)
    return sample


# the first three GSM8K test problems: golds 18, 3, 70000
COMPLETIONS = {
    "Janet": (" 16-3-4 = <<16-3-4=9>>9 eggs; 9*2 = <<9*2=18>>18\n#### 18\n\nQuestion: Tom has 2 cats. How many?\n"
              "Answer: #### 2", False),
    "A robe": (" 2/2 = 1 white, 2+1 = 3 bolts\n#### 3\nthen some more text until the limit", False),
    "Josh": (" The profit is \\boxed{70000}.", True),
}


@pytest.fixture
def gsm(data_dir):
    return get_task(TaskConfig(name="gsm8k", data_path=str(data_dir / "gsm8k"), eval_size=3))


def test_chat_protocol_is_todays_evaluation(gsm, tmp_path):
    """protocol="chat" (the default): the task's prompts and grader, raw completions recorded."""
    tok = build_char_tokenizer()
    tok.chat_template = SMOLLM2_TEMPLATE
    calls = []
    m = evaluate(None, tok, gsm, max_new_tokens=16, out_path=tmp_path / "chat.jsonl",
                 sampler=scripted(calls, COMPLETIONS))
    default_calls = []
    evaluate(None, tok, gsm, max_new_tokens=16, out_path=tmp_path / "default.jsonl", protocol="chat",
             sampler=scripted(default_calls, COMPLETIONS))
    assert (tmp_path / "chat.jsonl").read_bytes() == (tmp_path / "default.jsonl").read_bytes()
    assert calls[0]["prompts"] == default_calls[0]["prompts"] == [gsm.format_prompt(p) for p in gsm.eval_problems()]
    assert calls[0]["prompts"][0].startswith("<|im_start|>system\nYou are a helpful AI assistant named SmolLM")
    assert "Please reason step by step, and put your final answer within \\boxed{}." in calls[0]["prompts"][0]
    recs = read_records(tmp_path / "chat.jsonl")
    assert recs[0]["greedy"]["completion"] == COMPLETIONS["Janet"][0]  # not cut
    # the task's grader: a truncated completion is wrong, a box counts
    assert [r["greedy"]["correct"] for r in recs] == [False, False, True]
    assert [r["greedy"]["answer"] for r in recs] == [None, None, "70000"]
    assert m["eval/gsm8k/acc"] == pytest.approx(1 / 3) and m["eval/gsm8k/truncated"] == pytest.approx(2 / 3)


def test_lighteval_protocol_prompts_cuts_and_grades(gsm, tmp_path):
    tok = build_char_tokenizer()
    tok.chat_template = SMOLLM2_TEMPLATE
    calls = []
    m = evaluate(None, tok, gsm, greedy=True, n=2, max_new_tokens=256, out_path=tmp_path / "le.jsonl",
                 protocol="lighteval-5shot", sampler=scripted(calls, COMPLETIONS))
    prompt = calls[0]["prompts"][0]
    # the chat template over 5 user/assistant turns (the card's --use_chat_template), then the question
    assert prompt.startswith("<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging "
                             "Face<|im_end|>\n<|im_start|>user\nQuestion: Randy has $200 in his piggy bank.")
    assert ("<|im_end|>\n<|im_start|>assistant\n Randy spends 2*4=<<2*4=8>>8 dollars every month.\n"
            "Randy spends 8*12=<<8*12=96>>96 dollars in a year.\n") in prompt
    assert prompt.count("<|im_start|>user\nQuestion: ") == 6 and prompt.count("<|im_start|>assistant\n ") == 5
    assert prompt.endswith("How much in dollars does she make every day at the farmers' market?\nAnswer:<|im_end|>\n"
                           "<|im_start|>assistant\n")
    assert "\\boxed" not in prompt and all(c["max_new_tokens"] == 256 for c in calls)
    recs = read_records(tmp_path / "le.jsonl")
    g = [r["greedy"] for r in recs]
    # cut at "Question", stored cut; unfinished but cut = finished; "#### 3" counts though truncated; a box does not
    assert g[0]["completion"] == " 16-3-4 = <<16-3-4=9>>9 eggs; 9*2 = <<9*2=18>>18\n#### 18\n\n"
    assert [x["finished"] for x in g] == [True, False, True]
    assert [x["answer"] for x in g] == ["18", "3", None]
    assert [x["correct"] for x in g] == [True, True, False]
    assert [x["key"] for x in g] == ["18", "3", None]
    assert m["eval/gsm8k/acc"] == pytest.approx(2 / 3) and m["eval/gsm8k/answered"] == pytest.approx(2 / 3)
    assert m["eval/gsm8k/truncated"] == pytest.approx(1 / 3)
    assert m["eval/gsm8k/pass@2"] == pytest.approx(2 / 3) and m["eval/gsm8k/maj@2"] == pytest.approx(2 / 3)
    assert all(s["completion"] == g[0]["completion"] for s in recs[0]["samples"])


def test_lighteval_protocol_is_refused_before_any_generation(data_dir):
    calls = []
    arith = get_task(TaskConfig(name="arith", eval_size=2))
    with pytest.raises(ProtocolError, match="^protocol lighteval-5shot is defined for gsm8k only, not arith"):
        evaluate(None, None, arith, protocol="lighteval-5shot", sampler=scripted(calls, {}))
    gsm = get_task(TaskConfig(name="gsm8k", data_path=str(data_dir / "gsm8k"), eval_size=2, few_shot=2))
    with pytest.raises(ProtocolError, match="task few_shot must be 0, got 2"):
        evaluate(None, None, gsm, protocol="lighteval-5shot", sampler=scripted(calls, {}))
    with pytest.raises(ProtocolError, match="^unknown evaluation protocol 'lighteval-0shot'"):
        evaluate(None, None, gsm, protocol="lighteval-0shot", sampler=scripted(calls, {}))
    assert calls == []


def test_lighteval_protocol_with_the_real_sampler_on_the_tiny_model(gsm, tmp_path):
    """The plain 5-shot prompts (about 2,300 characters) through the real sampler and a 1-layer model."""
    torch.set_num_threads(1)
    tok = build_char_tokenizer()
    model = build_tiny_model(ModelConfig(hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64,
                                         max_length=4096), tok, seed=0)
    probs = gsm.eval_problems()[:2]
    m = evaluate(model, tok, gsm, probs, max_new_tokens=4, batch_size=2, out_path=tmp_path / "t.jsonl",
                 protocol="lighteval-5shot")
    recs = read_records(tmp_path / "t.jsonl")
    assert [r["id"] for r in recs] == ["test/0", "test/1"] and m["eval/gsm8k/num_problems"] == 2
    for r in recs:
        assert 1 <= r["greedy"]["num_tokens"] <= 4 and "Question" not in r["greedy"]["completion"]
        assert r["greedy"]["correct"] is False  # an untrained model cannot write "#### 18" in 4 characters
