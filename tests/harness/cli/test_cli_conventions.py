"""Command-line conventions (issue 14): --version, a description and help for every subcommand
and argument, no Sphinx markup, a one-screen `sweep --help`, one `--output-dir` spelling, one
list syntax for --only, Hydra-style arguments refused with the --set spelling, --set errors
naming the override, integer counters, third-party noise off unless --verbose."""
from __future__ import annotations

import argparse
import os
import re

import pytest

from harness.cli.main import build_parser, main
from harness.cli.polish import blame_override, quiet_third_party, split_list
from harness.report.format import count

QUICKSTART = "harness/configs/quickstart.yaml"


def _subparsers(parser):
    for a in parser._actions:
        if isinstance(a, argparse._SubParsersAction):
            return a.choices, {c.dest: c.help for c in a._choices_actions}
    raise AssertionError("no subcommands")


def test_version(capsys):
    with pytest.raises(SystemExit) as e:
        main(["--version"])
    assert e.value.code == 0 and re.match(r"harness \S+", capsys.readouterr().out)


def test_every_subcommand_and_argument_is_described_without_sphinx_markup(monkeypatch):
    monkeypatch.setenv("COLUMNS", "80")
    parser = build_parser()
    subs, one_liners = _subparsers(parser)
    assert set(subs) >= {"train", "quickstart", "warmup", "config", "eval", "sweep", "report", "sync", "ui"}
    for name, p in subs.items():
        assert one_liners.get(name) and "\n" not in one_liners[name], name
        assert p.description, f"{name}: no description"
        for a in p._actions:
            assert a.help, f"harness {name} {a.option_strings or a.dest}: no help"
        text = p.format_help()
        assert "``" not in text and not re.search(r":(func|class|mod|meth):`", text), name
    sweep = subs["sweep"].format_help()
    assert len(sweep.splitlines()) <= 40, sweep


def test_output_dir_everywhere_out_is_a_hidden_alias():
    subs, _ = _subparsers(build_parser())
    for name in ("report", "eval"):
        text = subs[name].format_help()
        assert "--output-dir" in text and "--out " not in text and "--out," not in text, name
    assert subs["report"].parse_args(["s", "--out", "x"]).out == "x"
    assert subs["report"].parse_args(["s", "--output-dir", "y"]).out == "y"
    assert subs["eval"].parse_args(["--model", "m", "--out", "x"]).out == "x"
    # every command that writes results takes --output-dir
    for name in ("train", "quickstart", "warmup", "sweep", "report", "eval"):
        assert "--output-dir" in subs[name].format_help(), name


def test_train_and_warmup_output_dir_sets_the_results_root(tmp_path):
    from harness.cli.train import _overrides, path_options
    subs, _ = _subparsers(build_parser())
    args = subs["train"].parse_args(["c.yaml", "--set", "output_dir=a", "--output-dir", str(tmp_path)])
    assert _overrides(args) == ["output_dir=a"]
    assert path_options(args) == {"output_dir": str(tmp_path)}  # the flag wins (applied last, as a path)
    assert _overrides(subs["warmup"].parse_args(["--set", "seed=1"])) == ["seed=1"]
    assert path_options(subs["warmup"].parse_args(["--set", "seed=1"])) == {}


def test_only_has_one_list_syntax_in_quickstart_and_sweep():
    subs, _ = _subparsers(build_parser())
    for argv in (["--only", "grpo", "ppo"], ["--only", "grpo,ppo"], ["--only", "grpo", "--only", "ppo"]):
        assert split_list(subs["quickstart"].parse_args(argv).only) == ["grpo", "ppo"]
        assert split_list(subs["sweep"].parse_args(["f.yaml", *argv]).only) == ["grpo", "ppo"]
    assert split_list(None) is None


def test_hydra_style_arguments_are_refused_with_the_set_spelling(capsys):
    for argv in (["train", QUICKSTART, "train.lr=3e-4"], ["train", "train.lr=3e-4"],
                 ["sweep", "sweeps/quickstart.yaml", "budget.amount=64", "--dry-run"]):
        with pytest.raises(SystemExit) as e:
            main(argv)
        err = capsys.readouterr().err
        assert e.value.code == 2 and "--set" in err and "=" in err, (argv, err)
        assert "Traceback" not in err
    assert "--set train.lr=3e-4" in main.__globals__["hydra_hint"]("train", ["train.lr=3e-4"])


def test_a_set_error_names_the_override_not_the_yaml_file(capsys):
    assert main(["config", "--show", QUICKSTART, "--set", "train.lr=abc"]) == 2
    err = capsys.readouterr().err
    assert "--set train.lr=abc" in err and QUICKSTART not in err
    assert main(["config", "--show", QUICKSTART, "--set", "train.lrx=1"]) == 2
    assert "--set train.lrx=1" in capsys.readouterr().err
    # an error of the file itself still names the file
    assert blame_override("eval.n: expected an integer (in cfg.yaml)", ["train.lr=1"]) == \
        "eval.n: expected an integer (in cfg.yaml)"


def test_counters_read_as_integers():
    assert count(32768.0, "samples") == "32,768 samples"
    assert count(12, "steps") == "12 steps"
    assert count(12.25, "seconds") == "12.2 seconds"
    assert count(1_000_000, "tokens") == "1,000,000 tokens"


def test_third_party_noise_off_unless_verbose(monkeypatch):
    for k in ("TRANSFORMERS_VERBOSITY", "HF_HUB_DISABLE_PROGRESS_BARS", "DS_ACCELERATOR"):
        monkeypatch.delenv(k, raising=False)
    quiet_third_party(True)
    assert "TRANSFORMERS_VERBOSITY" not in os.environ
    quiet_third_party(False)
    assert os.environ["TRANSFORMERS_VERBOSITY"] == "error" and os.environ["HF_HUB_DISABLE_PROGRESS_BARS"] == "1"
    from transformers.utils import logging as tlog
    assert not tlog.is_progress_bar_enabled()
    subs, _ = _subparsers(build_parser())
    assert subs["train"].parse_args([QUICKSTART, "--verbose"]).verbose is True


@pytest.mark.parametrize("argv,expected", [
    (["trian"], "harness: unknown command 'trian'; did you mean `harness train`?"),
    (["train", QUICKSTART, "--lr", "1e-5"], "harness train: --lr=1e-5 is a config field: --set train.lr=1e-5 or --set warmup.lr=1e-5"),
    (["train", QUICKSTART, "--learning_rate=1e-5"], "harness train: --learning_rate=1e-5 is a config field: --set train.lr=1e-5"),
    (["train", QUICKSTART, "--train.lr=1e-5"], "harness train: --train.lr=1e-5 is a config field: --set train.lr=1e-5"),
    (["train", QUICKSTART, "+train.lr=1e-5"], "harness train: +train.lr=1e-5: overrides are given with --set: --set train.lr=1e-5"),
    (["train", QUICKSTART, "~train.lr"], "harness train: ~train.lr: a field cannot be deleted"),
    (["train", QUICKSTART, "--no_progress"], "harness train: --no_progress is spelled --no-progress"),
    (["sweep", "s.yaml", "--dryrun"], "harness sweep: --dryrun: did you mean --dry-run?"),
])
def test_unknown_commands_and_flags_name_the_right_spelling(argv, expected, capsys):
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(expected), err
    assert len(err.splitlines()) == 1


@pytest.mark.parametrize("key,suggested", [("lr", "'train.lr'"), ("learning_rate", "'train.lr'"),
                                           ("beta", "'algorithm.kl_coef'"), ("num_generations", "'sampling.samples_per_prompt'")])
def test_a_set_of_an_unknown_key_suggests_the_full_dotted_key(key, suggested, capsys):
    assert main(["config", "--show", QUICKSTART, "--set", f"{key}=1"]) == 2
    err = capsys.readouterr().err
    assert f"unknown config key '{key}'; did you mean {suggested}" in err and f"(from --set {key}=1)" in err


def test_eval_help_shows_each_default_once():
    import re
    help_text = build_parser()._subparsers._group_actions[0].choices["eval"].format_help()
    entries, current = {}, None
    for line in help_text.split("options:", 1)[1].splitlines():
        if line.startswith("  -"):
            current = line.split()[0].rstrip(",")
            entries[current] = line
        elif current:
            entries[current] += " " + line.strip()
    assert {"--task", "--few-shot", "--temperature", "--limit", "--seed"} <= set(entries)
    for opt, text in entries.items():
        assert len(re.findall(r"\(default", text)) <= 1, text
    assert "(default: None)" not in help_text
    assert "(default: 0)" in entries["--limit"] and "(default: 1.0)" in entries["--temperature"]
