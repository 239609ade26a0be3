"""The MLflow UI view `harness ui` links each sweep to: runs grouped by algorithm, accuracy charts (percent) first, budget counters last.

MLflow 3.17's experiment page takes its layout from three places, read from its UI source
(``mlflow/server/js``: ``useSharedExperimentViewState``, ``ExperimentPageUIState``,
``RunsChartsCardConfig``):

- the URL's ``workflowType=machine_learning`` opens the model-training view (the experiment
  tag ``mlflow.experimentKind = custom_model_development`` does it too, for links without it),
  and ``compareRunsMode=CHART`` the chart view;
- ``viewStateShareKey=<key>`` applies the view saved in the experiment tag
  ``mlflow.sharedViewState.<key>``: the runs' grouping (``groupBy``: by algorithm, seeds
  averaged with a min-max band), the chart cards in order (``compareRunCharts``) and their
  sections (``compareRunSections``, kept in the given order by ``isAccordionReordered``;
  ``columns`` per section); without it, a fresh browser shows the parent run collapsed and
  one chart section per metric prefix sorted by name (``budget`` first). Which runs are
  expanded is not part of a shared view (MLflow drops ``runsExpanded``), hence the grouping;
  chart titles are the metric names (the page ignores a card's ``displayName``);
- a group's colour is a hash of its id (``<mode>.<key>.<value>``, MLflow's
  ``getStableColorForRun``): of the run's ``algorithm.name`` param and ``algorithm`` tag the
  view groups by the one whose algorithms get distinct colours (:func:`group_color`);
- the tag's value is a saved-view envelope (``{"name", "createdAt", "updatedAt", "state"}``,
  ``state`` = ``"deflate;"`` + base64 of the zlib-compressed JSON), so the view is also
  listed by name under the page's "Views" menu.

:func:`publish_view` builds the view from the sweep's metric names (from the server's REST
API; stdlib only, so `harness ui` stays light), writes the tag once (the key is a hash of the
view: the same runs give the same link) and removes the view it wrote before.
"""
from __future__ import annotations

import base64
import hashlib
import json
import time
import urllib.parse
import urllib.request
import zlib
from collections import Counter
from typing import Iterable, Optional

from harness.tracking.base import PERCENT_PREFIX

SHARE_PREFIX = "mlflow.sharedViewState."
"""MLflow's experiment tag prefix of a saved / shared view (``EXPERIMENT_PAGE_VIEW_STATE_SHARE_TAG_PREFIX``)."""
VIEW_TAG = "harness.ui_view"
"""Experiment tag naming the key of the view `harness ui` wrote last (the one to replace)."""
VIEW_NAME = "harness: accuracy by algorithm"
MODEL_METRICS = "Model metrics"
"""MLflow's section for metric names without a ``/``."""
RUN_LEVEL = ("final/", "initial/", "peak/", "n_params/", "wall_seconds", "budget/consumed")
"""Run-level metrics (one point per run, logged from summary.json): bar charts, after the curves."""
CURVES_FIRST = ("rollout", "train")
"""Sections of learning curves shown right after the accuracy ones, in this order."""


def section_of(key: str) -> str:
    """The chart section MLflow files a metric under: its name up to the last ``/``."""
    return key.rsplit("/", 1)[0] if "/" in key else MODEL_METRICS


def is_run_level(key: str) -> bool:
    return key in RUN_LEVEL or any(key.startswith(p) for p in RUN_LEVEL if p.endswith("/"))


def _task_rank(tasks: list[str]):
    order = {t: i for i, t in enumerate(tasks)}
    return lambda task: (order.get(task, len(order)), task)


def section_order(keys: Iterable[str], tasks: list[str]) -> list[tuple[str, list[str]]]:
    """(section, metric keys) in the order the view shows them: percent accuracy, then each
    task's evaluation (``tasks`` first, in that order), rollout and train curves, the other
    curves, the run-level values (final, initial, peak, ...), and the budget counters last."""
    rank = _task_rank(tasks)
    sections: dict[str, list[str]] = {}
    for k in sorted(set(keys)):
        sections.setdefault(section_of(k), []).append(k)

    def place(name: str) -> tuple:
        keys_ = sections[name]
        if name == PERCENT_PREFIX:
            return (0,)
        if name.startswith("eval/"):
            return (1, rank(name[len("eval/"):]))
        if name == "budget" and not all(is_run_level(k) for k in keys_):
            return (9,)
        if all(is_run_level(k) for k in keys_):
            head = name.split("/", 1)[0]
            return (5, {"final": 0, "initial": 1}.get(head, 2), rank(name.split("/", 1)[1]) if "/" in name else ("", ""),
                    name)
        if name in CURVES_FIRST:
            return (2, CURVES_FIRST.index(name))
        return (3, name)

    out = []
    for name in sorted(sections, key=place):
        keys_ = sections[name]
        if name == PERCENT_PREFIX:
            keys_ = sorted(keys_, key=lambda k: rank(k.split("/", 1)[1]))
        out.append((name, keys_))
    return out


def _card(key: str, section_uuid: str, n: int) -> dict:
    base = {"uuid": f"harness-chart-{n}", "metricSectionId": section_uuid, "deleted": False,
            "isGenerated": False, "runsCountToCompare": 10, "metricKey": key}
    if is_run_level(key):
        return {**base, "type": "BAR"}
    return {**base, "type": "LINE", "selectedMetricKeys": [key], "lineSmoothness": 0, "xAxisScaleType": "linear",
            "scaleType": "linear", "xAxisKey": "step", "selectedXAxisMetricKey": "", "yAxisKey": "metric",
            "yAxisExpressions": [], "ignoreOutliers": False, "useGlobalXaxisKey": True,
            "useGlobalLineSmoothing": True,
            "range": {"xMin": None, "xMax": None, "yMin": None, "yMax": None}}


PALETTE = ("#a6630c", "#c83243", "#b45091", "#8a63bf", "#434a93", "#137dae", "#04867d", "#308613", "#facb66",
           "#1f272d", "#445461", "#5f7281", "#8396a5", "#93320b", "#be501e", "#de7921", "#f2be88", "#115026",
           "#277c43", "#3ba65e", "#8ddda8", "#9e102c", "#c82d4c", "#e65b77", "#f792a6", "#0e538b", "#2272b4",
           "#4299e0", "#8acaff")
"""MLflow 3.17's run colours, in its order."""
GROUPINGS = (("param", "algorithm.name"), ("tag", "algorithm"))
"""What a harness run's algorithm can be grouped by (every run has both), in order of preference."""


def group_color(group_id: str) -> str:
    """The colour MLflow's UI gives a run group (a Fletcher-style checksum of its id into the palette)."""
    a = b = 0
    for ch in group_id:
        a = (a + ord(ch)) % 255
        b = (b + a) % 255
    return PALETTE[(a | b << 8) % len(PALETTE)]


def choose_grouping(values: dict) -> Optional[tuple[str, str]]:
    """Of :data:`GROUPINGS` present on the runs (``values``: grouping -> the algorithms seen), the
    one whose groups get the most distinct colours (the first on a tie); None without any."""
    best, score = None, -1
    for mode, key in GROUPINGS:
        algos = sorted(values.get((mode, key)) or ())
        if not algos:
            continue
        distinct = len({group_color(f"{mode}.{key}.{a}") for a in algos})
        if distinct > score:
            best, score = (mode, key), distinct
    return best


def view_state(keys: Iterable[str], tasks: list[str], grouping: Optional[tuple[str, str]] = None) -> dict:
    """The experiment page's state (search facets left to their defaults) for a sweep whose
    runs logged ``keys``: chart cards and sections in :func:`section_order` (the percent
    accuracy charts two to a row, the budget section folded), the runs grouped by ``grouping``
    (``(mode, key)``, :func:`choose_grouping`; mean of the seeds, min-max band)."""
    charts, sections = [], []
    for i, (name, keys_) in enumerate(section_order(keys, tasks)):
        uuid = f"harness-section-{i}"
        section = {"uuid": uuid, "name": name, "display": name != "budget", "isReordered": True,
                   "deleted": False, "isGenerated": False}
        if name == PERCENT_PREFIX:
            section["columns"] = min(2, len(keys_))
        sections.append(section)
        charts += [_card(k, uuid, len(charts) + j) for j, k in enumerate(keys_)]
    state = {
        "compareRunCharts": charts, "compareRunSections": sections, "isAccordionReordered": True,
        "hideEmptyCharts": True, "useGroupedValuesInCharts": True, "runsHiddenMode": "SHOW_ALL",
        "viewMaximized": False, "runListHidden": False, "autoRefreshEnabled": True,
        "globalLineChartConfig": {"xAxisKey": "step", "lineSmoothness": 0, "selectedXAxisMetricKey": ""},
        "groupsExpanded": {},
        "groupBy": ({"aggregateFunction": "average", "groupByKeys": [{"mode": grouping[0], "groupByData": grouping[1]}]}
                    if grouping else None),
    }
    return state


def encode_view(state: dict, created_ms: int) -> tuple[str, str]:
    """(key, tag value) of a view: the key is a hash of the state (the same view, the same
    key); the value is MLflow's saved-view envelope around the compressed state."""
    text = json.dumps(state, sort_keys=True, separators=(",", ":"))
    key = hashlib.sha256(text.encode()).hexdigest()[:20]
    packed = "deflate;" + base64.b64encode(zlib.compress(text.encode(), 9)).decode()
    envelope = json.dumps({"name": VIEW_NAME, "createdAt": created_ms, "updatedAt": created_ms, "state": packed})
    return key, envelope


def decode_view(value: str) -> dict:
    """The state inside a tag value written by :func:`encode_view` (for tests and checks)."""
    packed = json.loads(value)["state"]
    assert packed.startswith("deflate;"), packed[:20]
    return json.loads(zlib.decompress(base64.b64decode(packed[len("deflate;"):])))


def view_link(url: str, experiment_id: str, key: Optional[str]) -> str:
    """The experiment's runs page in the model-training, chart view, with the saved view."""
    query = {"workflowType": "machine_learning", "compareRunsMode": "CHART"}
    if key:
        query["viewStateShareKey"] = key
    return f"{url}/#/experiments/{experiment_id}/runs?{urllib.parse.urlencode(query)}"


# ---------------------------------------------------------------------------------------------
# talking to the server (REST, stdlib)
# ---------------------------------------------------------------------------------------------
def _call(url: str, path: str, body: Optional[dict] = None, timeout: float = 30.0, **query) -> dict:
    full = f"{url}/api/2.0/mlflow/{path}" + (f"?{urllib.parse.urlencode(query)}" if query else "")
    req = urllib.request.Request(full, data=None if body is None else json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"},
                                 method="GET" if body is None else "POST")
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return json.loads(r.read() or b"{}")


def sweep_metrics(url: str, experiment_id: str) -> tuple[set[str], list[str], dict]:
    """(metric keys, tasks most-run first, algorithms seen per :data:`GROUPINGS`) of the
    experiment's active runs."""
    keys: set[str] = set()
    tasks: Counter = Counter()
    algorithms: dict = {g: set() for g in GROUPINGS}
    token = None
    while True:
        body = {"experiment_ids": [experiment_id], "max_results": 1000, "run_view_type": "ACTIVE_ONLY"}
        if token:
            body["page_token"] = token
        res = _call(url, "runs/search", body)
        for run in res.get("runs", []):
            data = run.get("data", {})
            keys.update(m["key"] for m in data.get("metrics", []))
            found = {"tag": {t["key"]: t["value"] for t in data.get("tags", [])},
                     "param": {p["key"]: p["value"] for p in data.get("params", [])}}
            if found["tag"].get("task"):
                tasks[found["tag"]["task"]] += 1
            for mode, key in GROUPINGS:
                if found[mode].get(key):
                    algorithms[(mode, key)].add(found[mode][key])
        token = res.get("next_page_token")
        if not token:
            break
    return keys, [t for t, _ in sorted(tasks.items(), key=lambda kv: (-kv[1], kv[0]))], algorithms


def publish_view(url: str, experiment_id: str) -> Optional[str]:
    """Save the sweep's view on the server at ``url`` (an experiment tag) and return its key;
    None when the experiment has no metrics yet. Replaces the view written before."""
    keys, tasks, algorithms = sweep_metrics(url, experiment_id)
    if not keys:
        return None
    state = view_state(keys, tasks, choose_grouping(algorithms))
    key, value = encode_view(state, int(time.time() * 1000))
    exp = _call(url, "experiments/get", experiment_id=experiment_id)["experiment"]
    tags = {t["key"]: t["value"] for t in exp.get("tags", [])}
    if SHARE_PREFIX + key not in tags:
        _call(url, "experiments/set-experiment-tag", {"experiment_id": experiment_id, "key": SHARE_PREFIX + key,
                                                      "value": value})
    old = tags.get(VIEW_TAG)
    if old != key:
        _call(url, "experiments/set-experiment-tag", {"experiment_id": experiment_id, "key": VIEW_TAG, "value": key})
        if old and SHARE_PREFIX + old in tags:
            _call(url, "experiments/delete-experiment-tag", {"experiment_id": experiment_id, "key": SHARE_PREFIX + old})
    return key
