"""The committed quickstart reference: made in portable numerics, says so, and leaks no machine path.

`harness quickstart` reproduces its accuracies exactly where the kernels compute the same bits (portable numerics;
the README lists the CPU kinds this was verified on); this test holds the report to what a reader on another
machine needs to check that."""
import csv
import re

from support_paths import REPO
from harness.rundir.provenance import PORTABLE_CLAIM

REF = REPO / "results" / "reference" / "quickstart"


def test_reference_report_names_its_provenance_and_no_machine_path():
    md = (REF / "report.md").read_text()
    assert PORTABLE_CLAIM in md
    assert "numerics: portable" in md and "(dirty tree)" not in md
    assert re.search(r"code: [0-9a-f]{40}", md)
    for text in [md] + [p.read_text() for p in REF.glob("*.csv")]:
        assert not re.search(r"(^|[\s`'\"(])/(tmp|root|home|work|Users)/", text), "an absolute machine path"


def test_reference_accuracies_are_the_ones_the_readme_quotes():
    rows = {r["row"]: r for r in csv.DictReader((REF / "table.csv").open())}
    acc = {k: round(100 * float(rows[k]["arith/acc_frac_mean"]), 1) for k in ("start", "grpo", "ppo", "rft")}
    readme = (REPO / "README.md").read_text()
    for label, k in (("warm-up checkpoint", "start"), ("GRPO (lr 4e-4)", "grpo"), ("PPO (lr 3e-4)", "ppo"),
                     ("online RFT (lr 2e-4)", "rft")):
        assert f"| {label} | {acc[k]:.1f}%" in readme, (label, acc[k])
    ref = (REF / "README.md").read_text()
    assert "numerics" in ref and "9d696617f50236bbd8e2e0112debab0368f1b8b23832ac2a245e272f1caf2721" in ref
