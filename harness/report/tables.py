"""The tables of a sweep report as text: results (aggregate) and runs, for terminal, Markdown, HTML and CSV.

A results cell is ``mean ± half-width`` (`format_cell`: percentages for task metrics, whole
MiB for memory, seconds with one decimal; a single seed shows the value alone); the runs table
has one row per run, excluded runs marked. `settings_table` shows the config fields that differ
between rows, `paired_table` the paired differences over seeds from the first algorithm's row.
Rendering goes through `harness.report.format.table` / `number`.
"""
from __future__ import annotations

import html
from pathlib import Path
from typing import Optional

import numpy as np

from harness.report.aggregate import warmup_cost
from harness.report.format import number, table
from harness.rundir.read import RunData, k_of, split_metric

STAT_NOTE = ("mean ± 95% CI over seeds (two-sided Student-t, n-1 dof: t·s/√n); a single seed "
             "shows the value alone; failed/unfinished runs are excluded")
MISSING = "—"


def display_name(metric: str, unit: str = "steps") -> str:
    """Column header of a metric of the aggregate table."""
    names = {"peak_rss_mb": "peak RSS (MiB)", "peak_rss_above_base_mb": "RSS above base (MiB)",
             "peak_cuda_mb": "peak CUDA (MiB)", "wall_seconds": "wall-clock (s)",
             "train_seconds": "train time (s)", "warmup_seconds": "warm-up (s)",
             "budget_consumed": f"budget ({unit})", "seeds": "n"}
    if metric in names:
        return names[metric]
    task, m = split_metric(metric)
    return f"{task} {m} (%)"


def _is_pct(metric: str) -> bool:
    return "/" in metric


def format_cell(metric: str, mean: float, half: float, clip: bool = True) -> str:
    """``mean ± half`` of one aggregate cell in the metric's unit ("—" without a value). A rate's
    interval that crosses 0% or 100% is shown cut there, as ``[lo, hi]``, unless ``clip`` is off
    (a difference of rates, which may be negative)."""
    if mean is None or not np.isfinite(mean):
        return MISSING
    if metric == "seeds":
        return str(int(mean))
    if _is_pct(metric):
        scale, spec = 100.0, ".1f"
    elif metric.endswith("_mb"):
        scale, spec = 1.0, ".0f"
    elif metric == "budget_consumed":
        scale, spec = 1.0, (".0f" if float(mean).is_integer() else ".1f")
    else:
        scale, spec = 1.0, ".1f"
    s = number(mean * scale, spec, int_spec=spec)
    if half is not None and np.isfinite(half) and not (metric == "budget_consumed" and half == 0):
        if clip and _is_pct(metric) and (mean - half < 0.0 or mean + half > 1.0):  # the interval, cut to 0-100%
            lo, hi = max(mean - half, 0.0), min(mean + half, 1.0)
            return f"{s} [{number(lo * scale, spec)}, {number(hi * scale, spec)}]"
        half_spec = spec if metric != "budget_consumed" else ".1f"
        s += " ± " + number(half * scale, half_spec, int_spec=half_spec)
    return s


def formatted_table(df):
    """The table as strings with display headers (what the Markdown/HTML/terminal show)."""
    import pandas as pd

    unit = df.attrs.get("budget_unit", "steps")
    metrics = list(dict.fromkeys(df.columns.get_level_values(0)))
    out = pd.DataFrame(index=df.index)
    for m in metrics:
        out[display_name(m, unit)] = [_cell(df, i, m) for i in df.index]
    return out


def _cell(df, row, metric: str) -> str:
    """One table cell; a start evaluation that every seed shares (the same checkpoint, so a zero
    spread) says so instead of showing "± 0.0"."""
    mean, half = df.at[row, (metric, "mean")], df.at[row, (metric, "ci95")]
    n = df.at[row, (metric, "n")] if (metric, "n") in df.columns else None
    if (row == "start" and _is_pct(metric) and half is not None and np.isfinite(half) and half == 0
            and n is not None and n > 1):
        return f"{format_cell(metric, mean, None)} (same start in all {int(n)} seeds)"
    return format_cell(metric, mean, half)


def settings_table(keys: list[str], values: dict[str, dict[str, str]]) -> Optional[tuple[list[str], list[list]]]:
    """(header, rows) of the "settings that differ" table (one row per results row, one column
    per differing config field, from `aggregate.differing_settings`); None when nothing differs."""
    if not keys:
        return None
    return ["row"] + list(keys), [[label] + [row[k] for k in keys] for label, row in values.items()]


def format_diff(metric: str, d: dict) -> str:
    """One paired difference: signed mean ± half-width in the metric's unit (percentage points
    for task metrics) and the number of seed pairs; no ± below two pairs."""
    if d["n"] == 0 or not np.isfinite(d["mean"]):
        return MISSING
    cell = format_cell(metric, abs(d["mean"]), d["half"] if d["n"] > 1 else float("nan"), clip=False)
    return ("-" if d["mean"] < 0 else "+") + cell + f" (n={d['n']})"


def paired_table(base: str, diffs: dict[str, dict[str, dict]], unit: str = "steps") \
        -> Optional[tuple[list[str], list[list]]]:
    """(header, rows) of the "paired differences vs <base>" table from `aggregate.paired_differences`."""
    if not diffs:
        return None
    cols = list(next(iter(diffs.values())))
    header = ["difference"] + [display_name(c, unit).replace("(%)", "(points)") for c in cols]
    return header, [[f"{label} − {base}"] + [format_diff(c, row[c]) for c in cols] for label, row in diffs.items()]


def _results_rows(fdf) -> tuple[list[str], list[list]]:
    return [fdf.index.name or ""] + list(fdf.columns), [[i] + list(r) for i, r in zip(fdf.index, fdf.values)]


def format_table(df, note: bool = True) -> str:
    """Aligned plain-text table for a terminal."""
    f = formatted_table(df)
    header = [f.index.name or ""] + list(f.columns)
    body = [[str(i)] + list(r) for i, r in zip(f.index, f.itertuples(index=False))]
    text = table(header, body, "ruled", align="l" + "r" * (len(header) - 1))
    return text + f"\n({STAT_NOTE})" if note else text


def results_markdown(fdf) -> str:
    """The formatted aggregate table as Markdown."""
    return table(*_results_rows(fdf), "markdown")


def results_html(df, fdf, table_id: str) -> str:
    """The formatted aggregate table as HTML; each cell carries data-row / data-col (metric key)."""
    cols = ["row"] + list(dict.fromkeys(df.columns.get_level_values(0)))
    header, rows = _results_rows(fdf)
    rows = [[str(r[0])] + r[1:] for r in rows]
    return table(header, rows, "html", table_attrs=f' id="{table_id}"',
                 row_attrs=[' class="start"' if idx == "start" else "" for idx in fdf.index],
                 cell_attrs=[[f' data-row="{_attr(idx)}" data-col="{_attr(c)}"' for c in cols[:len(r)]]
                             for idx, r in zip(fdf.index, rows)])


def _attr(s) -> str:
    return html.escape(str(s))


def runs_frame(runs: list[RunData], tasks: list[str]):
    """One row per run (finished or not): status, whether aggregated, greedy accuracy per task,
    peak memory, wall-clock, budget consumed (and the samples used, where dynamic sampling dropped some), error."""
    import pandas as pd

    recs = []
    for r in runs:
        rec = {"run_id": r.run_id, "algorithm": r.algorithm, "seed": r.seed, "status": r.status,
               "included": r.status == "finished"}
        for t in tasks:
            rec[f"{t}/acc"] = r.final_eval.get(f"{t}/acc")
        rec.update({"peak_rss_mb": r.peak["rss_mb"], "peak_rss_above_base_mb": r.peak["rss_above_base_mb"],
                    "peak_cuda_mb": r.peak["cuda_mb"], "wall_seconds": r.wall_seconds,
                    "warmup_seconds": warmup_cost(r.summary),
                    "budget_unit": r.budget_unit, "budget_consumed": r.budget_consumed,
                    "samples_used": samples_used(r.summary), "error": r.error or ""})
        recs.append(rec)
    return pd.DataFrame(recs)


def samples_used(summary: dict):
    """The samples a run's updates used, where it differs from those drawn (dynamic sampling drops groups whose
    rewards are all equal, and the budget is charged for every sample drawn); None otherwise."""
    b = summary.get("budget") if isinstance(summary, dict) and isinstance(summary.get("budget"), dict) else {}
    used, drawn = b.get("samples_used"), b.get("samples_drawn")
    return used if isinstance(used, (int, float)) and isinstance(drawn, (int, float)) and used != drawn else None


def _budget_cell(r) -> str:
    used = r.get("samples_used")
    extra = f" ({used:,.0f} used)" if isinstance(used, (int, float)) and used == used else ""
    return _value(r["budget_consumed"], ".0f") + f" {r['budget_unit']}" + extra


def _value(v, spec: str) -> str:
    return number(v, spec, int_spec=spec, missing=MISSING, nonfinite=MISSING)


def runs_display(runs_df, tasks) -> tuple[list[str], list[list]]:
    """(header, rows) of the runs table as shown in Markdown and HTML."""
    header = ["run", "algorithm", "seed", "status"] + [f"{t} acc (%)" for t in tasks] + \
             ["peak RSS (MiB)", "wall-clock (s)", "budget", "note"]
    rows = []
    for _, r in runs_df.iterrows():
        note = "" if r["included"] else ("excluded from aggregates" + (f": {r['error']}" if r["error"] else ""))
        seed = "" if r["seed"] is None or r["seed"] != r["seed"] else int(r["seed"])
        accs = [_value(r[f"{t}/acc"] * 100 if r[f"{t}/acc"] is not None else None, ".1f") for t in tasks]
        rows.append([r["run_id"], r["algorithm"], seed, r["status"]] + accs +
                    [_value(r["peak_rss_mb"], ".0f"), _value(r["wall_seconds"], ".1f"),
                     _budget_cell(r), note])
    return header, rows


def runs_html(runs_df, header: list[str], rows: list[list], table_id: str) -> str:
    """The runs table as HTML; runs left out of the aggregates get class 'failed'."""
    return table(header, rows, "html", table_attrs=f" id='{table_id}'",
                 row_attrs=["" if inc else " class='failed'" for inc in runs_df["included"]])


def csv_column(metric: str) -> str:
    """A metric's name in the CSV files: accuracies stay fractions there (0-1, as in
    ``metrics.jsonl`` and ``summary.json``) and say so, ``arith/acc`` -> ``arith/acc_frac``
    (also ``maj@K``, ``pass@K``); the Markdown and HTML tables print them in percent."""
    _, name = split_metric(metric)
    return f"{metric}_frac" if "/" in metric and (name == "acc" or k_of(name)) else metric


def write_csvs(df, runs_df, out: Path) -> tuple[Path, Path]:
    """``table.csv`` (aggregate table, columns ``<metric>_<stat>``, accuracies as
    ``<task>/acc_frac_mean`` etc.: :func:`csv_column`) and ``runs.csv`` in ``out``."""
    flat = df.copy()
    flat.columns = [f"{csv_column(m)}_{s}" for m, s in df.columns]
    csv_path, runs_csv = out / "table.csv", out / "runs.csv"
    flat.to_csv(csv_path)
    runs_df.rename(columns=csv_column).to_csv(runs_csv, index=False)
    return csv_path, runs_csv
