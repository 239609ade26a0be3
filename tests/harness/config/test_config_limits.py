"""Config limits (audit: bad inputs that crashed or failed silently mid-run): every thread count
is capped, the built-in tiny model is bounded in size (and its head dimension is even), and the
tracking section's enumerated values and URI are checked when the config loads. Each refusal is
one ConfigError naming the field and the value; nothing here trains or builds a large model."""
from __future__ import annotations

from pathlib import Path

import pytest

from harness.config.fields import option_problem
from harness.config.rules import COMPLETION_TOKENS, THREADS_OR_DEFAULT, field_rules
from harness.config.schema import (MAX_THREADS, MAX_TINY_PARAMS, TINY_VOCAB_SIZE, WANDB_MODES, Config, ConfigError,
                                   EvalConfig, ModelConfig, SamplingConfig, TrainConfig, config_from_dict, load_config,
                                   tiny_param_count)
from harness.foundation.base import dotted_fields

ROOT = Path(__file__).resolve().parents[3]
QUICKSTART = ROOT / "harness" / "configs" / "quickstart.yaml"


def refused(overrides) -> str:
    with pytest.raises(ConfigError) as e:
        load_config(QUICKSTART, overrides)
    msg = str(e.value)
    assert "\n" not in msg
    return msg


# ------------------------------------------------------------------ 1. thread counts

THREAD_FIELDS = [f for f in dotted_fields(Config) if f.rsplit(".", 1)[-1] == "threads"]


def test_the_thread_fields_are_found():
    assert {"train.threads", "warmup.threads"} <= set(THREAD_FIELDS)


@pytest.mark.parametrize("field", THREAD_FIELDS)
def test_every_thread_count_is_capped(field):
    msg = refused([f"{field}=100000"])
    assert msg.startswith(f"{field}=100000 is invalid: must be between ") and f"and {MAX_THREADS}" in msg
    assert refused([f"{field}=-1"]).startswith(f"{field}=-1 is invalid: must be between ")
    assert getattr(getattr(load_config(QUICKSTART, [f"{field}={MAX_THREADS}"]), field.split(".")[0]),
                   field.split(".")[1]) == MAX_THREADS


def test_thread_counts_keep_their_lower_bounds():
    assert load_config(QUICKSTART, ["train.threads=0"]).train.threads == 0  # 0: the default count
    assert refused(["warmup.threads=0"]) == (f"warmup.threads=0 is invalid: must be between 1 and {MAX_THREADS} "
                                             f"(in {QUICKSTART})")


# ------------------------------------------------------------------ 2. the tiny model's size

def test_param_count_is_the_built_models():
    from harness.engine.models import build_char_tokenizer, build_tiny_model, num_params

    tok = build_char_tokenizer()
    assert len(tok) == TINY_VOCAB_SIZE
    for kw in (dict(hidden_size=16, num_layers=1, num_heads=2, intermediate_size=32),
               dict(hidden_size=48, num_layers=2, num_heads=3, intermediate_size=7)):
        m = ModelConfig(**kw)
        assert tiny_param_count(m) == num_params(build_tiny_model(m, tok))
    assert tiny_param_count(ModelConfig()) == 865_920  # the quickstart's 0.87M


@pytest.mark.parametrize("field,value", [("hidden_size", 4194304), ("num_layers", 100000),
                                         ("intermediate_size", 10**9)])
def test_a_tiny_model_too_large_to_hold_is_refused(field, value):
    msg = refused([f"model.{field}={value}"])
    assert msg.startswith(f"model.{field}={value} is invalid: the built-in tiny model would hold about ")
    assert f"({field}={value}, " in msg or f", {field}={value}, " in msg
    assert f"more than {MAX_TINY_PARAMS:,}" in msg
    assert "lower model.hidden_size, model.num_layers or model.intermediate_size" in msg


def test_the_message_gives_the_estimate():
    n = tiny_param_count(ModelConfig(hidden_size=4194304))
    assert n == 281_494_761_242_624
    assert ("would hold about 2.8e14 parameters (hidden_size=4194304, num_layers=4, intermediate_size=384, a "
            "100-token vocabulary)") in refused(["model.hidden_size=4194304"])


def test_the_size_field_named_is_the_one_furthest_above_its_default():
    msg = refused(["model.hidden_size=8192", "model.num_layers=64"])  # 8192 = 64 x 128; 64 = 16 x 4
    assert msg.startswith("model.hidden_size=8192 is invalid")


def test_a_large_tiny_model_within_the_limit_loads():
    cfg = load_config(QUICKSTART, ["model.hidden_size=4096", "model.num_layers=4", "model.num_heads=32",
                                   "model.intermediate_size=11008"])
    assert tiny_param_count(cfg.model) <= MAX_TINY_PARAMS


def test_the_size_fields_of_a_model_folder_are_not_bounded():
    cfg = load_config(QUICKSTART, ["model.name_or_path=/some/hf/folder", "model.hidden_size=4194304"])
    assert cfg.model.hidden_size == 4194304  # the folder's config.json sizes it; the path is checked at start


def test_an_odd_head_dimension_is_refused():
    msg = refused(["model.hidden_size=12", "model.num_heads=4"])
    assert msg.startswith("model.num_heads=4 is invalid: model.hidden_size / model.num_heads = 3 must be even")


# ------------------------------------------------------------------ 3. tracking

@pytest.mark.parametrize("mode", ["bogus", "Offline", ""])
def test_wandb_mode_must_be_one_wandb_knows(mode):
    msg = refused(["tracking.wandb=true", f"tracking.wandb_mode={mode}"])
    assert msg.startswith(f"tracking.wandb_mode={mode!r} is invalid: must be one of offline, online, disabled")
    msg = refused([f"tracking.wandb_mode={mode}"])  # wrong whether or not wandb is on
    assert msg.startswith(f"tracking.wandb_mode={mode!r} is invalid")


@pytest.mark.parametrize("mode", WANDB_MODES)
def test_wandb_modes_load(mode):
    assert load_config(QUICKSTART, ["tracking.wandb=true", f"tracking.wandb_mode={mode}"]).tracking.wandb_mode == mode


@pytest.mark.parametrize("project,holds", [("a/b", "/"), ("team:x", ":"), ("", None), ("p" * 129, None)])
def test_wandb_project_must_be_a_name_wandb_takes(project, holds):
    msg = refused(["tracking.wandb=true", f"tracking.wandb_project={project}"])
    assert msg.startswith("tracking.wandb_project=") and "must be a wandb project name: 1 to 128 characters" in msg
    if holds:
        assert f"(it holds {holds})" in msg


@pytest.mark.parametrize("uri,why", [
    ("garbage", "has no URI scheme (a folder: sqlite:///garbage/mlflow.db)"),
    ("/abs/path", "has no URI scheme"),
    ("", "is empty"),
    ("bogus://x", "scheme 'bogus:' is not one MLflow keeps runs with"),
    ("sqlite://x.db", "a SQLite store is sqlite:///<path to the .db file>"),
    ("sqlite:///", "a SQLite store is"),
    ("http:/host", "an http store is http://<host>"),
    ("https://", "an https store is https://<host>"),
    ("file://", "a file store is file:<path>"),
    ("postgresql:db", "a postgresql store is"),
])
def test_mlflow_uri_must_be_a_tracking_uri(uri, why):
    msg = refused([f"tracking.mlflow_uri={uri}"])
    assert msg.startswith(f"tracking.mlflow_uri={uri!r} is invalid: {why}")
    assert "accepted: sqlite:///<path>.db, file:<path>, http(s)://<host>[:<port>]" in msg
    assert "or null (sqlite:///<output_dir>/mlflow.db)" in msg


@pytest.mark.parametrize("uri", ["sqlite:///results/mlflow.db", "sqlite:////abs/mlflow.db", "file:/tmp/mlruns",
                                 "file:///tmp/mlruns", "http://localhost:5000", "https://mlflow.example.org/path",
                                 "postgresql://u:p@host/db", "postgresql+psycopg2://u@h/db", "mysql://u@h/db",
                                 "databricks", "databricks://profile", "databricks-uc"])
def test_mlflow_uris_load(uri):
    assert load_config(QUICKSTART, [f"tracking.mlflow_uri={uri}"]).tracking.mlflow_uri == uri


# ------------------------------------------------------------------ 5. each rule once (issue 44)

def test_a_rule_is_declared_on_its_field_and_an_option_keeps_it():
    assert THREADS_OR_DEFAULT in field_rules(TrainConfig)["threads"]
    assert COMPLETION_TOKENS in field_rules(SamplingConfig)["max_new_tokens"]
    assert COMPLETION_TOKENS in field_rules(EvalConfig)["max_new_tokens"]
    assert option_problem("train.threads", 2000, "--threads") == \
        "--threads=2000 is invalid: must be between 0 and 1024 (0: the default count)"
    assert refused(["train.threads=2000"]).startswith("train.threads=2000 is invalid: must be between 0 and 1024 ")
    assert option_problem("eval.n", 3, "--n") is None


def test_the_evaluation_completion_limit_is_the_samplings():
    """eval.max_new_tokens had no upper limit; it keeps sampling.max_new_tokens' (COMPLETION_TOKENS)."""
    assert refused(["eval.max_new_tokens=2000000"]).startswith(
        "eval.max_new_tokens=2000000 is invalid: must be <= 1048576")


def test_a_reward_model_round_is_drawn_as_one_stage():
    """reward_model.samples_per_round had no upper limit; it keeps `harness rm train --samples`' (STAGE_SAMPLES)."""
    assert refused(["reward_model.samples_per_round=2000000"]).startswith(
        "reward_model.samples_per_round=2000000 is invalid: must be between 1 and 1000000 (drawn at once")


@pytest.mark.parametrize("field", ["name", "device"])
def test_a_trailing_newline_is_refused(field):
    """The name and device rules match the whole value (a regex's $ took "cpu\\n" and "run\\n" before)."""
    with pytest.raises(ConfigError, match=f"^{field}=.* is invalid: must be"):
        config_from_dict({field: {"name": "run", "device": "cpu"}[field] + "\n"})
