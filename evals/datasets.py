"""Dataset tasks: ``gsm8k``, ``math`` (MATH, Hendrycks et al.) and ``math500`` (MATH-500).

Data comes from local JSONL files in the formats of ``shared/data`` (see its README):

=========  ==============================  =================================  =====================
task       test split (eval_problems)      train split (sample_train, shots)   gold answer
=========  ==============================  =================================  =====================
gsm8k      ``gsm8k/test.jsonl``            ``gsm8k/train.jsonl``               text after ``####``
math       ``math/test.jsonl``             ``math/train.jsonl``                last ``\\boxed{}``
math500    ``math/math500_test.jsonl``     ``math/train.jsonl``                ``answer`` field
=========  ==============================  =================================  =====================

Where the files are (``TaskConfig.data_path``):

* unset: the data root is ``$GRPO_HARNESS_DATA`` if set, else the first ``shared/data``
  folder found walking up from the current directory and then from this package's
  directory (so ``../shared/data`` next to the project root is found from anywhere inside it);
* a directory: the files above by their base names inside it (``train.jsonl``, ``test.jsonl``,
  ``math500_test.jsonl`` falling back to ``test.jsonl``);
* a file: the test split; the train split is ``train.jsonl`` beside it (a file whose name
  starts with ``train`` is the train split, and ``test.jsonl`` beside it the test split);
* ``hf:<name>[:<config>]``: a hub dataset through ``datasets.load_dataset`` (online use only),
  splits ``train`` and ``test``, rows with the same fields as the local files.

Relative paths are tried from the current directory, then from the project root. A missing
file, a line that is not JSON, or a row without an expected field raises
:class:`DatasetError` / ``FileNotFoundError`` naming the file, the line and the field. Files
are read lazily: :meth:`DatasetTask.eval_problems` with ``eval_size`` N (``harness eval
--limit N``) reads only up to the N-th usable row, so a bad line after it is never seen.

Prompts: with a tokenizer bound (:meth:`DatasetTask.bind_tokenizer`) that has a chat
template, the question (and ``few_shot`` worked examples from the train split, as earlier
user/assistant turns) go through ``apply_chat_template``; otherwise a plain
``Question: ...\\nAnswer:`` template is used. Both ask for the final answer in ``\\boxed{}``;
grading also accepts ``#### N``, "the answer is N" and (GSM8K, MATH) the last number.

Grading: a completion that was truncated (``finished=False``) is wrong, as in ``arith``,
unless (plain template) the model went on to write the next ``Question:``, which ends the
answer; the text from that marker on is ignored.
"""
from __future__ import annotations

import errno
import json
import os
import random
from pathlib import Path
from typing import Iterator, Optional

from evals.grading import (clean_answer, extract_answer, extract_gsm8k_gold, is_equiv, last_boxed,
                           strip_calculator_annotations)
from evals.tasks import Problem, Task, TaskSpec, register_task

__all__ = ["DatasetError", "DatasetTask", "GSM8KTask", "MathTask", "Math500Task", "find_data_root",
           "iter_jsonl", "read_jsonl", "INSTRUCTION"]

PROJECT_ROOT = Path(__file__).resolve().parents[1]

INSTRUCTION = "Please reason step by step, and put your final answer within \\boxed{}."
STOP_MARKERS = ("\nQuestion:",)


class DatasetError(ValueError):
    """A data file that cannot be used (message names the file, line and field)."""


class _SkipRow(Exception):
    """A well-formed row without a usable gold answer (e.g. MATH train line 5530, whose
    solution ends in an empty ``\\boxed{}``): left out, with a warning."""


# --------------------------------------------------------------------------------------
# files
# --------------------------------------------------------------------------------------
def find_data_root(start: Optional[Path] = None) -> Optional[Path]:
    """``$GRPO_HARNESS_DATA``, else the first ``shared/data`` up from ``start`` (default: the
    current directory), then up from this package. None if there is none."""
    env = os.environ.get("GRPO_HARNESS_DATA")
    if env:
        return Path(env).expanduser()
    starts = [Path(start) if start else Path.cwd(), PROJECT_ROOT]
    for s in starts:
        s = s.resolve()
        for d in (s, *s.parents):
            cand = d / "shared" / "data"
            if cand.is_dir():
                return cand
    return None


def iter_jsonl(path: Path, required: tuple[str, ...] = ()) -> Iterator[tuple[int, dict]]:
    """(line number, row) for every non-blank line, read lazily: a bad line raises (naming
    file/line/field) only when the reader gets to it, so a consumer that stops early never
    sees a corrupt line further on. A file without any row raises at its end."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"data file not found: {path}")
    n = 0
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise DatasetError(f"{path}:{lineno}: not valid JSON ({e.msg})") from None
            if not isinstance(row, dict):
                raise DatasetError(f"{path}:{lineno}: expected a JSON object, got {type(row).__name__}")
            for name in required:
                if name not in row:
                    raise DatasetError(f"{path}:{lineno}: missing field '{name}' "
                                       f"(rows need: {', '.join(required)})")
            n += 1
            yield lineno, row
    if not n:
        raise DatasetError(f"{path}: no rows")


def read_jsonl(path: Path, required: tuple[str, ...] = (), limit: Optional[int] = None) -> list[tuple[int, dict]]:
    """(line number, row) for every non-blank line -- or only the first ``limit`` rows, in
    which case nothing after them is read (nor checked); raises naming file/line/field."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"data file not found: {path}")
    if limit is not None and limit <= 0:
        limit = None
    out = []
    rows = iter_jsonl(path, required)
    try:
        for item in rows:
            out.append(item)
            if limit is not None and len(out) >= limit:
                break
    finally:
        rows.close()  # closes the file now when stopped early
    return out


def _resolve_path(p: str) -> Path:
    q = Path(p).expanduser()
    if q.is_absolute() or q.exists():
        return q
    alt = PROJECT_ROOT / q
    return alt if alt.exists() else q


# --------------------------------------------------------------------------------------
# tasks
# --------------------------------------------------------------------------------------
class DatasetTask(Task):
    """A task read from train/test JSONL files (see the module docstring)."""

    name = "dataset"
    default_files: dict[str, str] = {}
    """split -> path under the data root."""
    required_fields: tuple[str, ...] = ()
    hub_default: Optional[tuple[str, Optional[str]]] = None

    def __init__(self, cfg=None):
        self.cfg = cfg or TaskSpec(name=self.name)
        self.tokenizer = None
        self._splits: dict[str, list[Problem]] = {}
        self._heads: dict[str, list[Problem]] = {}  # first problems of a split read only in part
        self._shots: Optional[list[Problem]] = None
        self._hub: Optional[tuple[str, Optional[str]]] = None
        self.files: dict[str, Optional[Path]] = {}
        self._locate()

    # -- where the data is ---------------------------------------------------
    def _locate(self):
        dp = self.cfg.data_path
        if dp and str(dp).startswith("hf:"):
            name, _, config = str(dp)[3:].partition(":")
            self._hub = (name, config or None)
            return
        if not dp:
            root = find_data_root()
            if root is None:
                raise FileNotFoundError(
                    f"task {self.name}: no data folder found (looked for shared/data up from {Path.cwd()} and "
                    f"{PROJECT_ROOT}); set task.data_path or GRPO_HARNESS_DATA{self._hub_hint()}")
            self.files = {s: root / rel for s, rel in self.default_files.items()}
            test = self.files["test"]
            if not test.is_file():
                raise FileNotFoundError(f"task {self.name}: data file not found: {test} "
                                        f"(set task.data_path or GRPO_HARNESS_DATA{self._hub_hint()})")
            return
        p = _resolve_path(str(dp))
        if p.is_dir():
            self.files = {}
            for split, rel in self.default_files.items():
                base = Path(rel).name
                cand = p / base
                if not cand.exists() and split == "test" and base != "test.jsonl":
                    cand = p / "test.jsonl"
                self.files[split] = cand
            if not self.files["test"].is_file() and not self.files["train"].is_file():
                raise FileNotFoundError(f"task {self.name}: no {Path(self.default_files['test']).name} or "
                                        f"train.jsonl in data directory {p}")
            return
        if not p.is_file():
            raise FileNotFoundError(f"task {self.name}: data file not found: {dp} (task.data_path; tried {p})")
        if p.name.startswith("train"):
            self.files = {"train": p, "test": p.parent / "test.jsonl"}
        else:
            self.files = {"test": p, "train": p.parent / "train.jsonl"}

    def _hub_hint(self) -> str:
        if not self.hub_default:
            return ""
        name, config = self.hub_default
        return f", or task.data_path=hf:{name}{':' + config if config else ''} when online"

    def _load_split(self, split: str, limit: Optional[int] = None) -> list[Problem]:
        """The problems of ``split`` -- with ``limit``, at least its first ``limit`` problems
        (all if it has fewer): the file is read lazily and only as far as they need, so a bad
        line after them neither fails nor slows down, e.g., ``harness eval --limit 10``."""
        if split in self._splits:
            return self._splits[split]
        if limit is not None and limit <= 0:
            limit = None
        head = self._heads.get(split)
        if limit is not None and head is not None and len(head) >= limit:
            return head
        src = None
        if self._hub is not None:
            rows = iter(self._hub_rows(split))
        else:
            path = self.files.get(split)
            if path is None or not path.is_file():
                raise FileNotFoundError(f"task {self.name}: {split} split not found: {path} "
                                        f"(task.data_path={self.cfg.data_path!r})")
            src = iter_jsonl(path, self.required(split))
            rows = ((f"{path}:{ln}", row) for ln, row in src)
        probs, skipped, complete = [], [], True
        try:
            for where, row in rows:
                try:
                    probs.append(self.make_problem(row, split, len(probs), where))
                except _SkipRow as e:
                    skipped.append(f"{where} ({e})")
                if limit is not None and len(probs) >= limit:
                    complete = False  # (or not: unknown, as the next line is not read)
                    break
        finally:
            if src is not None:
                src.close()
        if skipped:
            import warnings
            warnings.warn(f"task {self.name}: {len(skipped)} row(s) without a usable answer left out: "
                          + "; ".join(skipped[:5]), stacklevel=2)
        if not probs:
            raise DatasetError(f"task {self.name}: no usable rows in the {split} split")
        if complete:
            self._splits[split] = probs
            self._heads.pop(split, None)
        else:
            self._heads[split] = probs
        return probs

    def _hub_rows(self, split: str) -> list[tuple[str, dict]]:
        name, config = self._hub
        src = f"hf:{name}{':' + config if config else ''}"
        try:
            import datasets  # the Hugging Face package (optional, online use)
        except ImportError:
            raise DatasetError(f"task {self.name}: {src} needs the datasets package (pip install datasets), "
                               f"or give a local JSONL file as the data path") from None
        try:
            ds = datasets.load_dataset(name, config, split=split)
        except Exception as e:  # offline (ConnectionError), no such dataset, config or split
            if isinstance(e, OSError) and e.errno in (errno.ENOSPC, errno.EDQUOT, errno.EACCES, errno.EROFS):
                raise  # the machine, not the name: the command line says so (exit 3)
            why = " ".join(str(e).split()) or type(e).__name__
            why = why if len(why) <= 200 else why[:200] + "..."
            raise DatasetError(f"task {self.name}: cannot load {src} [{split}] ({type(e).__name__}: {why}): "
                               f"check the name and the network, or download it beforehand and give its "
                               f"JSONL file as the data path") from None
        out = []
        for i, row in enumerate(ds):
            where = f"hf:{name}[{split}] row {i}"
            need = self.required(split)
            for f in need:
                if f not in row:
                    raise DatasetError(f"{where}: missing field '{f}' (rows need: {', '.join(need)})")
            out.append((where, dict(row)))
        return out

    def required(self, split: str) -> tuple[str, ...]:
        """Fields every row of ``split`` must have."""
        return self.required_fields

    @staticmethod
    def _field(row: dict, name: str, where: str) -> str:
        v = row.get(name)
        if not isinstance(v, str) or not v.strip():
            raise DatasetError(f"{where}: field '{name}' must be a non-empty string, got {v!r:.60}")
        return v

    def make_problem(self, row: dict, split: str, index: int, where: str) -> Problem:
        raise NotImplementedError

    # -- problems ------------------------------------------------------------
    def train_problems(self) -> list[Problem]:
        return self._load_split("train")

    def sample_train(self, rng: random.Random, n: int) -> list[Problem]:
        """``n`` training problems drawn with ``rng`` (without replacement when ``n`` fits)."""
        pool = self.train_problems()
        if n <= len(pool):
            return [pool[i] for i in rng.sample(range(len(pool)), n)]
        return [pool[rng.randrange(len(pool))] for _ in range(n)]

    def eval_problems(self) -> list[Problem]:
        """The first ``eval_size`` problems of the test split (all when eval_size <= 0)."""
        size = int(self.cfg.eval_size or 0)
        if size > 0:  # only as much of the file as these need is read
            return list(self._load_split("test", size)[:size])
        return list(self._load_split("test"))

    def few_shot_examples(self) -> list[Problem]:
        k = int(getattr(self.cfg, "few_shot", 0) or 0)
        if k <= 0:
            return []
        if self._shots is None:
            pool = self.train_problems()
            rng = random.Random(f"{self.name}-few-shot-{self.cfg.seed}")
            self._shots = [pool[i] for i in rng.sample(range(len(pool)), min(k, len(pool)))]
        return self._shots

    # -- prompting -----------------------------------------------------------
    def bind_tokenizer(self, tokenizer) -> "DatasetTask":
        """Use this tokenizer's chat template (if it has one) in :meth:`format_prompt`."""
        self.tokenizer = tokenizer
        return self

    def worked_solution(self, problem: Problem) -> str:
        """The few-shot answer text: the solution ending in ``\\boxed{answer}``."""
        return problem.solution

    @staticmethod
    def _has_chat_template(tokenizer) -> bool:
        return tokenizer is not None and bool(getattr(tokenizer, "chat_template", None))

    def format_prompt(self, problem: Problem, tokenizer=None) -> str:
        tok = tokenizer if tokenizer is not None else self.tokenizer
        shots = self.few_shot_examples()
        if self._has_chat_template(tok):
            msgs = []
            for ex in shots:
                msgs.append({"role": "user", "content": f"{ex.question}\n{INSTRUCTION}"})
                msgs.append({"role": "assistant", "content": self.worked_solution(ex)})
            msgs.append({"role": "user", "content": f"{problem.question}\n{INSTRUCTION}"})
            return tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
        parts = [INSTRUCTION, ""]
        for ex in shots:
            parts.append(f"Question: {ex.question}\nAnswer: {self.worked_solution(ex)}\n")
        parts.append(f"Question: {problem.question}\nAnswer:")
        return "\n".join(parts)

    # -- grading -------------------------------------------------------------
    def _plain(self) -> bool:
        return not self._has_chat_template(self.tokenizer)

    def _answer_part(self, completion: str) -> tuple[str, bool]:
        """(text up to a stop marker, whether a marker ended it)."""
        if self._plain():
            cut = min((i for i in (completion.find(m) for m in STOP_MARKERS) if i >= 0), default=-1)
            if cut >= 0:
                return completion[:cut], True
        return completion, False

    def extract_answer(self, completion: str) -> Optional[str]:
        if not isinstance(completion, str):
            return None
        try:
            return extract_answer(self._answer_part(completion)[0])
        except Exception:
            return None

    def final_answer(self, completion: str, finished: bool = True) -> Optional[str]:
        """The answer that grading counts: None when nothing is extracted or the completion
        was truncated (and not ended by a stop marker)."""
        try:
            if not isinstance(completion, str):
                return None
            text, stopped = self._answer_part(completion)
            if not (finished or stopped):
                return None
            return extract_answer(text)
        except Exception:
            return None

    def is_correct(self, completion: str, problem: Problem, finished: bool = True) -> bool:
        try:
            ans = self.final_answer(completion, finished)
            return ans is not None and is_equiv(ans, problem.answer)
        except Exception:
            return False


class GSM8KTask(DatasetTask):
    name = "gsm8k"
    default_files = {"train": "gsm8k/train.jsonl", "test": "gsm8k/test.jsonl"}
    required_fields = ("question", "answer")
    hub_default = ("openai/gsm8k", "main")

    def make_problem(self, row: dict, split: str, index: int, where: str) -> Problem:
        q = self._field(row, "question", where)
        sol = self._field(row, "answer", where)
        try:
            gold = extract_gsm8k_gold(sol)
        except ValueError:
            raise DatasetError(f"{where}: field 'answer' has no '#### <number>' final line") from None
        if not gold:
            raise DatasetError(f"{where}: field 'answer' has an empty '####' answer")
        return Problem(id=f"{split}/{index}", question=q.strip(), answer=gold, solution=sol,
                       meta={"split": split, "index": index})

    def worked_solution(self, problem: Problem) -> str:
        lines = strip_calculator_annotations(problem.solution).split("\n")
        body = "\n".join(ln for ln in lines if not ln.lstrip().startswith("####")).strip()
        return f"{body}\nThe final answer is $\\boxed{{{problem.answer}}}$."


class MathTask(DatasetTask):
    name = "math"
    default_files = {"train": "math/train.jsonl", "test": "math/test.jsonl"}
    required_fields = ("problem", "solution")
    hub_default = None

    def make_problem(self, row: dict, split: str, index: int, where: str) -> Problem:
        q = self._field(row, "problem", where)
        sol = row.get("solution", "")
        if "answer" in row and row["answer"] is not None:
            gold = str(row["answer"]).strip()
            if not gold:
                raise DatasetError(f"{where}: field 'answer' is empty")
        else:
            sol = self._field(row, "solution", where)
            gold = last_boxed(sol)
            if gold is None:
                raise DatasetError(f"{where}: field 'solution' has no \\boxed{{...}} final answer")
            if not gold.strip():
                raise _SkipRow("empty \\boxed{} in field 'solution'")
            gold = gold.strip()
        uid = row.get("unique_id") or f"{split}/{index}"
        meta = {"split": split, "index": index}
        for k in ("level", "type", "subject"):
            if k in row:
                meta[k] = row[k]
        return Problem(id=str(uid), question=q.strip(), answer=gold, solution=str(sol or ""), meta=meta)

    def worked_solution(self, problem: Problem) -> str:
        sol = problem.solution.strip()
        if last_boxed(sol) is None:
            sol = f"{sol}\nThe final answer is $\\boxed{{{clean_answer(problem.answer)}}}$."
        return sol


class Math500Task(MathTask):
    name = "math500"
    default_files = {"train": "math/train.jsonl", "test": "math/math500_test.jsonl"}
    hub_default = ("HuggingFaceH4/MATH-500", None)

    def required(self, split: str) -> tuple[str, ...]:
        # MATH-500 test rows carry 'answer'; the train split is MATH's (answer in 'solution')
        return ("problem", "answer") if split == "test" else ("problem", "solution")


@register_task("gsm8k")
def _make_gsm8k(cfg):
    return GSM8KTask(cfg)


@register_task("math")
def _make_math(cfg):
    return MathTask(cfg)


@register_task("math500")
def _make_math500(cfg):
    return Math500Task(cfg)
