"""bench/lora_step.py's worker on the tiny model at a tiny step shape: the figures the README's LoRA
table reports are what they say (trainable parameters by hand; the weights held are the policy and
its reference copy for full fine-tuning, one base plus the adapters for LoRA; Adam state two moments
of each trained weight)."""
import pytest

from lora_step import parse, worker

H, I, L, V = 128, 384, 4, 100  # the quickstart's model: hidden, MLP width, layers, vocabulary
FULL = V * H + L * (4 * H * H + 3 * H * I + 2 * H) + H  # tied embeddings (harness.config.sections.tiny_param_count)


@pytest.mark.parametrize("kind", ["full", "lora"])
def test_worker_reports_trainable_weights_held_and_adam_state(kind, tmp_path):
    a = parse(["--model", "tiny", "--rank", "2", "--prompts", "2", "--group", "2", "--max-new-tokens", "3",
               "--steps", "1", "--warmup", "0", "--worker", kind, "--worker-out", str(tmp_path / "o.json")])
    r = worker(a)
    adapters = L * 2 * (4 * 2 * H + 3 * (H + I))
    mib = 4 / 2**20  # float32 bytes, in MiB
    if kind == "full":
        assert r["trainable"] == FULL
        assert r["param_storage_mb"] == pytest.approx(2 * FULL * mib)     # the policy and its reference copy
        assert r["optimizer_state_mb"] == pytest.approx(2 * FULL * mib, rel=1e-3)  # exp_avg, exp_avg_sq (+ steps)
    else:
        assert r["trainable"] == adapters
        assert r["param_storage_mb"] == pytest.approx((FULL + adapters) * mib)   # one base, no reference copy
        assert r["optimizer_state_mb"] == pytest.approx(2 * adapters * mib, rel=1e-2)
    assert r["step_seconds"] > 0 and r["peak_rss_mb"] > 0
