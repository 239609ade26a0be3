"""Issue 48, item 7 (in part): every field added this round (objectives, staleness and correction, LoRA, the
sampler's precision) probed with the values a careless or hostile user gives; each is one ConfigError naming the
field and the rule, before any work (`harness config --show` loads and checks without training)."""
from __future__ import annotations

import pytest

from harness.config.schema import load_config
from harness.foundation.base import ConfigError

QUICKSTART = "harness/configs/quickstart.yaml"

BAD = [
    ("algorithm.eps_high=0", "algorithm.eps_high=0.0 is invalid: must be > 0"),
    ("algorithm.eps_low=-1", "algorithm.eps_low=-1.0 is invalid: must be in (0, 1]"),
    ("algorithm.eps_high=.nan", "algorithm.eps_high: NaN is not a valid value"),
    ("algorithm.ratio_level=foo", "must be one of token, sequence"),
    ("algorithm.max_resample=-1", "algorithm.max_resample=-1 is invalid"),
    ("algorithm.max_resample=1000000000", "algorithm.max_resample=1000000000 is invalid: must be between 0 and 100"),
    ("algorithm.overlong_buffer=100000", "algorithm.overlong_buffer=100000.0 is invalid: must be in [0, 1)"),
    ("algorithm.overlong_penalty=-1", "algorithm.overlong_penalty=-1.0 is invalid: must be >= 0"),
    ("algorithm.correction=foo", "algorithm.correction='foo' is invalid: must be one of none, token_tis"),
    ("algorithm.correction_cap=0.5", "algorithm.correction_cap=0.5 is invalid: must be > 1"),
    ("algorithm.correction_cap=.inf", "algorithm.correction_cap=inf is invalid: must be a finite number"),
    ("train.staleness=-1", "train.staleness=-1 is invalid: must be >= 0"),
    ("train.staleness=1000000000", "train.staleness=1000000000 is invalid: must be <= 64"),
    ("train.staleness=2.5", "train.staleness: expected an integer, got 2.5"),
    ("sampling.dtype=int8", "sampling.dtype='int8' is invalid: must be one of float32, bfloat16, float16"),
    ("sampling.threads=5000", "sampling.threads=5000 is invalid: must be between 0 and 1024"),
    ("model.lora.rank=-1", "model.lora.rank=-1 is invalid: must be between 0 and 4096"),
    ("model.lora.alpha=0", "model.lora.alpha=0.0 is invalid: must be > 0"),
    ("model.lora.target_modules=[lm_head]", "model.lora.target_modules=('lm_head',) is invalid"),
    ("model.lora.target_modules=[]", "model.lora.target_modules=() is invalid: must be a non-empty list"),
]


@pytest.mark.parametrize("setting,must", BAD, ids=[b[0] for b in BAD])
def test_new_fields_refuse_bad_values_in_one_line(setting, must):
    with pytest.raises(ConfigError) as e:
        load_config(QUICKSTART, [setting])
    assert must in str(e.value) and "\n" not in str(e.value)


def test_their_edges_load():
    load_config(QUICKSTART, ["algorithm.max_resample=100", "algorithm=dapo"])
    load_config(QUICKSTART, ["train.staleness=64", "algorithm.correction=seq_mask", "algorithm.correction_cap=1.5"])
    load_config(QUICKSTART, ["model.lora.rank=4096", "model.lora.target_modules=[q_proj]"])
