"""`harness report RESULTS_DIR/<sweep> [--out DIR]`: paper-style comparison of a sweep.

Writes ``report.md``, ``report.html`` (plots embedded as base64 PNG, so the file stands
alone), ``table.csv`` (the aggregate table), ``runs.csv`` (one row per run) and
``plots/*.png`` into ``--out`` (default ``<sweep>/report/``). ``harness sweep`` writes the same
report when all its runs have finished. The sweep file's ``report.columns`` (dotted paths into
summary.json, recorded in ``sweep.json``) add a per-run table of those values.

The table has one row for the starting checkpoint and one per algorithm (per algorithm
*and* config, when a sweep holds several configs of one algorithm: the label then names the
keys that differ). Columns: greedy accuracy per task, maj@K and pass@K at the largest K
evaluated, peak memory, wall-clock and budget consumed.

Statistics: each cell is the mean over seeds ± the half-width of a two-sided 95% Student-t
confidence interval, ``t_{0.975, n-1} * s / sqrt(n)`` with ``s`` the sample standard
deviation (ddof=1) over the ``n`` runs (seeds) of that row. With a single seed the value is
shown alone (no interval); the notes give each row's seeds and this method. Below the notes,
"settings that differ" lists every config field (effective values) that differs between rows,
and "paired differences vs <first row>" each other row's mean per-seed difference with the
t-interval of those differences (`harness.report.stats.paired_diff_ci`, runs paired by seed).
Only runs with status ``finished`` enter the aggregates; failed
(and still-running) runs are listed in the runs table, marked, and excluded. The starting
checkpoint row uses each run's ``initial_eval`` (evaluation before any RL update): runs that
share a seed start from the same checkpoint, so their initial evaluations are averaged
per seed first and the interval is over seeds. A metric a run did not log (e.g. pass@k of a
run evaluated greedily only) is left out of that cell's mean; a cell with no value shows "—".
"""
from __future__ import annotations

import base64
import html
import io
import json
import os
from pathlib import Path

from harness.foundation.base import ConfigError, flatten
from harness.report.aggregate import (baseline_label, build_table, differing_settings, group_runs,
                                      load_sweep_runs, paired_differences, per_seed_initial, seeds_note,
                                      select_by_validation, selection_notes)
from harness.report.format import md_safe, number, table
from harness.report.plots import PLOT_TITLES, figures
from harness.report.tables import (STAT_NOTE, formatted_table, paired_table, results_html, results_markdown,
                                   runs_display, runs_frame, runs_html, settings_table, write_csvs)
from harness.rundir.layout import read_json
from harness.rundir.outputs import check_output, staged
from harness.rundir.provenance import describe as describe_provenance, portable_path
from harness.rundir.read import UNREADABLE, UNVERIFIED, RunData

_CSS = """
body{font-family:-apple-system,Segoe UI,Helvetica,Arial,sans-serif;margin:24px auto;max-width:1200px;color:#222}
h1{font-size:1.5em} h2{font-size:1.2em;margin-top:1.6em;border-bottom:1px solid #ddd;padding-bottom:4px}
table{border-collapse:collapse;font-size:0.9em;margin:8px 0}
.scroll{overflow-x:auto;max-width:100%}
th,td{border:1px solid #ccc;padding:4px 8px;text-align:right;white-space:nowrap}
th:first-child,td:first-child{text-align:left}
thead th{background:#f3f3f3}
tr.start td{background:#fafafa;font-style:italic}
tr.failed td{color:#a00}
.note{color:#555;font-size:0.9em}
figure{margin:12px 0} figure img{max-width:100%;border:1px solid #eee}
figcaption{color:#555;font-size:0.9em}
"""


def _save_plots(figs: dict, out: Path) -> tuple[dict[str, Path], dict[str, bytes]]:
    """PNG of every figure (skipping None) into ``out/plots``: ({name: path}, {name: png bytes})."""
    plots: dict[str, Path] = {}
    pngs: dict[str, bytes] = {}
    for name, fig in figs.items():
        if fig is None:
            continue
        buf = io.BytesIO()
        fig.savefig(buf, format="png")
        pngs[name] = buf.getvalue()
        path = out / "plots" / f"{name}.png"
        path.write_bytes(pngs[name])
        plots[name] = path
    return plots, pngs


def _notes(runs: list[RunData], done: list[RunData], unit: str, ks: dict, excluded: list[str],
           missing: list[str]) -> list[str]:
    """The bullet notes under the results table (statistics, rows, K, memory, budget, exclusions)."""
    amounts = sorted({(r.summary.get("budget") or {}).get("amount") for r in runs} - {None})
    budget_line = (f"budget: {', '.join(number(a, 'g', whole=True) for a in amounts)} {unit} per run; "
                   if amounts else "") + \
        f"{len(done)} of {len(runs)} runs finished"
    k_line = ", ".join(f"{t}: K={k}" for t, k in ks.items()) or "no maj@k/pass@k evaluated"
    notes = [STAT_NOTE + ".",
             "start = the starting checkpoint (each run's evaluation before any RL update, averaged per seed).",
             f"maj@K / pass@K at the largest K evaluated ({k_line}); accuracy is greedy.",
             "memory: peak resident set size (RSS) of the run, and the same minus the process baseline the trainer "
             "records (RSS above base); "
             "wall-clock includes evaluation, train time does not; neither includes building or waiting for "
             "the shared warm-up: warm-up (s) is the time its checkpoint took to build once, wherever it was "
             "built (a run of the sweep, or `harness quickstart` before the runs), shared by the runs that "
             "start from it.",
             budget_line + "."]
    if excluded:
        notes.append(f"excluded from aggregates (not finished): {', '.join(excluded)}.")
    resumed = sorted(r.run_id for r in done if r.resumed)
    if resumed:
        notes.append(f"wall-clock leaves out {len(resumed)} run(s) resumed after an interruption "
                     f"({', '.join(resumed)}): a resumed run's summary holds only its last attempt's wall-clock; its "
                     "train time counts every attempt.")
    bad = unusable_runs(runs)
    if bad:
        notes.append("runs whose files could not be used (listed, not aggregated): " + "; ".join(bad) + ".")
    if missing:
        notes.append(f"plots without data in this sweep: {', '.join(missing)}.")
    return notes


def _sweep_json(sweep_dir: Path) -> dict:
    """The sweep's ``sweep.json`` as ``harness sweep`` wrote it ({} without, or not an object)."""
    doc = read_json(Path(sweep_dir) / "sweep.json", {})
    return doc if isinstance(doc, dict) else {}


def sweep_baseline(sweep_dir: Path) -> str | None:
    """The sweep file's ``report.baseline`` as ``harness sweep`` recorded it in sweep.json (None without)."""
    rep = _sweep_json(sweep_dir).get("report")
    b = rep.get("baseline") if isinstance(rep, dict) else None
    return b if isinstance(b, str) and b.strip() else None


def sweep_columns(sweep_dir: Path) -> list[str]:
    """The sweep file's ``report.columns`` as ``harness sweep`` recorded them in sweep.json ([] without)."""
    cols = _sweep_json(sweep_dir).get("report_columns")
    return [str(c) for c in cols] if isinstance(cols, list) else []


def columns_table(runs: list[RunData], columns: list[str]):
    """(header, rows) of ``report.columns``: one row per run, each column a dotted path into summary.json."""
    if not columns:
        return None
    rows = []
    for r in runs:
        flat = flatten(r.summary, keep_empty=True)
        vals = [flat.get(c) for c in columns]
        rows.append([r.run_id, r.status] + ["—" if v is None else (f"{v:.4g}" if isinstance(v, float) else str(v))
                                            for v in vals])
    return ["run id", "status"] + list(columns), rows


def _comparison_sections(groups, df, base: str | None = None) -> list[tuple[str, str, tuple]]:
    """(title, table id, (header, rows)) of the tables that compare rows: the config fields that
    differ between them, and each row's paired difference over seeds from the row ``base`` (a label;
    default the first row)."""
    out = []
    settings = settings_table(*differing_settings(groups))
    if settings:
        out.append(("Settings that differ between rows", "settings-table", settings))
    cols = [c for c in dict.fromkeys(df.columns.get_level_values(0)) if c != "seeds"]
    base, diffs = paired_differences(groups, cols, base)
    paired = paired_table(base, diffs, df.attrs.get("budget_unit", "steps"))
    if paired:
        out.append((f"Paired differences vs {base} (mean over seeds of the per-seed difference ± 95% CI)",
                    "paired-table", paired))
    return out


def _where(sweep_dir: Path) -> str:
    """The sweep folder as ``<results>/<name>``: no machine path in a report."""
    return portable_path(str(Path(sweep_dir).resolve()), Path(sweep_dir).resolve().parent)


def provenance_lines(runs: list) -> list[str]:
    """What produced the runs: one block when they share code, CPU, numerics and versions,
    else one block per distinct provenance with the runs it covers."""
    groups: dict[str, tuple[dict, list[str]]] = {}
    for r in runs:
        prov = (r.summary or {}).get("provenance") or {}
        prov = prov if isinstance(prov, dict) else {}
        key = json.dumps({k: v for k, v in prov.items() if k != "command"}, sort_keys=True, default=str)
        groups.setdefault(key, (prov, []))[1].append(r.run_id)
    if not groups:
        return ["no runs"]
    lines = []
    for prov, ids in groups.values():
        head = [] if len(groups) == 1 else [f"runs {', '.join(sorted(ids))}:"]
        try:
            described = describe_provenance(prov)
        except Exception as e:  # a hand-edited provenance: said so, not a crash of the report
            described = [f"provenance unreadable ({type(e).__name__})"]
        lines += head + [line for line in described if not line.startswith("command:")]
    return lines


def unusable_runs(runs: list[RunData]) -> list[str]:
    """``<run id>: <reason>`` for each run whose files could not be read or whose ``finished``
    is not borne out (status ``unreadable`` / ``unverified``): listed, never aggregated."""
    return [f"{r.run_id}: {r.error}" for r in runs if r.status in (UNREADABLE, UNVERIFIED)]


def _markdown(sweep: str, sweep_dir: Path, fdf, notes: list[str], plots: dict[str, Path], runs_table,
              cols_table=None, sections=(), runs_prov=()) -> str:
    """report.md: results table, notes, one section per plot, runs table."""
    hdr, rrows = runs_table
    md = [f"# Report: {sweep}", "", f"Sweep directory: `{_where(sweep_dir)}`", ""]
    md += ["## Provenance", ""] + [f"- {line}" for line in provenance_lines(runs_prov)] + [""]
    md += ["## Results", "", results_markdown(fdf), ""] + [f"- {n}" for n in notes] + [""]
    for title, _, (hdr_, rows_) in sections:
        md += [f"## {title}", "", table(hdr_, rows_, "markdown"), ""]
    for name, path in plots.items():
        md += [f"## {PLOT_TITLES[name]}", "", f"![{PLOT_TITLES[name]}](plots/{path.name})", ""]
    if cols_table:
        md += ["## Columns of the sweep file (report.columns)", "", table(*cols_table, "markdown"), ""]
    md += ["## Runs", "", table(hdr, rrows, "markdown"), ""]
    return "\n".join(md)


def _html(sweep: str, sweep_dir: Path, df, fdf, notes: list[str], pngs: dict[str, bytes], runs_df,
          runs_table, cols_table=None, sections=(), runs_prov=()) -> str:
    """report.html: the same content as report.md, plots embedded as base64 PNG."""
    parts = [f"<!doctype html><html><head><meta charset='utf-8'><title>Report: {html.escape(sweep)}</title>"
             f"<style>{_CSS}</style></head><body>",
             f"<h1>Report: {html.escape(sweep)}</h1>",
             f"<p class='note'>Sweep directory: <code>{html.escape(_where(sweep_dir))}</code></p>",
             "<h2>Provenance</h2><ul class='note' id='provenance'>"
             + "".join(f"<li>{html.escape(line)}</li>" for line in provenance_lines(runs_prov)) + "</ul>",
             "<h2>Results</h2><div class='scroll'>" + results_html(df, fdf, "results-table") + "</div>",
             "<ul class='note'>" + "".join(f"<li>{html.escape(n)}</li>" for n in notes) + "</ul>"]
    for title, tid, (hdr_, rows_) in sections:
        parts.append(f"<h2>{html.escape(title)}</h2><div class='scroll'>"  # a wide table scrolls, the page does not
                     + table(hdr_, rows_, "html", table_attrs=f" id='{tid}'") + "</div>")
    for name, png in pngs.items():
        b64 = base64.b64encode(png).decode()
        parts.append(f"<h2>{html.escape(PLOT_TITLES[name])}</h2><figure>"
                     f"<img id='plot-{name}' class='plot' alt='{html.escape(PLOT_TITLES[name])}' "
                     f"src='data:image/png;base64,{b64}'>"
                     f"<figcaption>plots/{name}.png</figcaption></figure>")
    if cols_table:
        parts.append("<h2>Columns of the sweep file (report.columns)</h2>"
                     + table(*cols_table, "html", table_attrs=" id='columns-table'"))
    parts.append("<h2>Runs</h2>" + runs_html(runs_df, *runs_table, "runs-table"))
    parts.append("</body></html>")
    return "\n".join(parts)


def build_report(sweep_dir: str | os.PathLike, out_dir: str | os.PathLike | None = None,
                 columns: list[str] | None = None, baseline: str | None = None) -> dict:
    """Write report.md, report.html, table.csv, runs.csv and plots/*.png for one sweep.

    ``columns``: the sweep file's ``report.columns`` (default: as recorded in ``sweep.json``).
    ``baseline``: the algorithm whose row the paired differences are taken from (default: the sweep
    file's ``report.baseline`` as recorded in ``sweep.json``, else the first row); given here and
    matching no row of finished runs, it is a ConfigError and nothing is written.

    Returns ``{"table": DataFrame, "runs": DataFrame, "markdown": Path, "html": Path,
    "csv": Path, "runs_csv": Path, "plots": {name: Path}, "out_dir": Path,
    "excluded": [run_id, ...], "unusable": ["<run id>: <reason>", ...]}``. A run whose files
    cannot be read (or whose ``finished`` is not borne out) is listed with its reason in the
    runs table, the notes and ``unusable``; the other runs are reported as usual."""
    sweep_dir = Path(sweep_dir)
    out = Path(out_dir) if out_dir is not None else sweep_dir / "report"
    check_output(out, "report", "report folder")  # replaced whole: never a folder of someone else's files
    with staged(out) as stage:  # written beside the old report, moved into place whole (a kill or a full
        res = _write_report(sweep_dir, stage, columns, baseline)  # disk leaves the old one as it was)
    for key in ("markdown", "html", "csv", "runs_csv"):
        res[key] = out / res[key].name
    res["plots"] = {name: out / "plots" / p.name for name, p in res["plots"].items()}
    res["out_dir"] = out
    return res


def _write_report(sweep_dir: Path, out: Path, columns: list[str] | None, baseline: str | None = None) -> dict:
    """:func:`build_report` into the folder ``out`` (its stage)."""
    runs = load_sweep_runs(sweep_dir)
    (out / "plots").mkdir(parents=True, exist_ok=True)

    df = build_table(runs)
    tasks, ks, unit = df.attrs["tasks"], df.attrs["ks"], df.attrs["budget_unit"]
    done = [r for r in runs if r.status == "finished"]
    figs = figures(group_runs(done), per_seed_initial(done), tasks, ks, unit)
    plots, pngs = _save_plots(figs, out)
    missing = [PLOT_TITLES[n] for n, f in figs.items() if f is None]

    fdf = formatted_table(df)
    runs_df = runs_frame(runs, tasks)
    excluded = [r.run_id for r in runs if r.status != "finished"]
    csv_path, runs_csv = write_csvs(df, runs_df, out)
    sweep = runs[0].sweep if runs else sweep_dir.name
    notes = _notes(runs, done, unit, ks, excluded, missing)
    selection = select_by_validation(runs)
    notes += selection_notes(selection)
    groups = group_runs(done)
    notes.insert(1, seeds_note(groups))
    name = baseline if baseline is not None else sweep_baseline(sweep_dir)  # the command line's, else the sweep's
    base = baseline_label(groups, name) if name else None
    if name and base is None:
        if baseline is not None:
            raise ConfigError(f"--baseline {baseline!r} matches no row of finished runs (rows: "
                              f"{', '.join(groups) or 'none'})")
        notes.append(f"report.baseline {name!r}: no finished run of that algorithm; the paired differences "
                     f"are taken from the first row.")
    sections = _comparison_sections(groups, df, base)
    runs_table = runs_display(runs_df, tasks)
    md_path, html_path = out / "report.md", out / "report.html"
    cols_table = columns_table(runs, sweep_columns(sweep_dir) if columns is None else columns)
    md_path.write_text(md_safe(_markdown(sweep, sweep_dir, fdf, notes, plots, runs_table, cols_table, sections, done)))
    html_path.write_text(_html(sweep, sweep_dir, df, fdf, notes, pngs, runs_df, runs_table, cols_table, sections,
                               done))
    return {"table": df, "runs": runs_df, "markdown": md_path, "html": html_path, "csv": csv_path,
            "runs_csv": runs_csv, "plots": dict(plots), "out_dir": out, "excluded": excluded,
            "unusable": unusable_runs(runs),
            "selection": selection, "sections": sections}
