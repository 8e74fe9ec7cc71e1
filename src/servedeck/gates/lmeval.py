"""The lm-eval gate: an lm-evaluation-harness task run against the launched server (extra servedeck[eval]).

    servedeck gate MODEL --eval lm-eval:TASK --task-dir DIR --threshold T

lm-eval runs as a child process (`python -m servedeck.gates.lmeval_child run`: lm-eval's own command
line), its own event loop and its own failures kept apart from servedeck's, through local-chat-completions
on the server's /v1/chat/completions with the task's prompts sent as chat messages: the server applies its
own chat template and tokenizer, so lm-eval needs none. A request that fails is one failed sample, not
the end of the run (gates/lmeval_child.py): its eval.jsonl line carries the error and counts as one.
Its results JSON and samples JSONL stay in the run folder under lm-eval/, and each sample becomes one
eval.jsonl line (gates/samples.py): correct when the task's first metric is 1 for it.

No hub at run time: the task is a YAML file in DIR (`task: NAME`, `dataset_path: json` and
`dataset_kwargs.data_files` naming local files, relative to DIR), and lm-eval runs with the Hugging Face
hub and datasets offline. Checked before any launch: lm-eval installed, the task found in DIR, its data
local, and a generative task (`output_type: generate_until`): loglikelihood and multiple-choice tasks
need prompt logprobs, which llama-server does not return (they would score at chance there) and which
lm-eval's chat-completions model cannot ask for on any engine.
"""

from __future__ import annotations

import asyncio
import glob
import importlib.util
import json
import os
import signal
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional

from servedeck.engines import all_engines
from servedeck.engines.base import Endpoint
from servedeck.errors import RunError, UsageError
from servedeck.gates import samples as S

FAILED = "[servedeck: the request failed]"  # the child's answer for a failed request (gates/lmeval_child.py)

LOGLIKELIHOOD = ("loglikelihood", "loglikelihood_rolling", "multiple_choice")
OUT = "lm-eval"  # the folder in the run folder holding lm-eval's own files
CHILD_MODEL = "servedeck-chat-completions"  # local-chat-completions, a failed request one failed sample
REQUEST_ERRORS = "request_errors.jsonl"  # under OUT: {"prompt", "error"} per failed request


@dataclass(frozen=True)
class Task:
    name: str
    yaml: Path
    output_type: str
    data_files: list[Path]


def _yaml() -> Any:
    if importlib.util.find_spec("lm_eval") is None or importlib.util.find_spec("yaml") is None:
        raise UsageError("--eval lm-eval:…: lm-eval is not installed in servedeck's environment",
                         hint="pip install 'servedeck[eval]' (lm-eval from PyPI), or use --eval PATH.jsonl, "
                              "the built-in gate")
    import yaml

    return yaml


def find_task(task: str, task_dir: Optional[Path]) -> Task:
    """The task's YAML in `task_dir`, read and checked (no hub: its data must be local files)."""
    yaml = _yaml()
    if task_dir is None:
        raise UsageError(f"lm-eval:{task}: give --task-dir, the folder holding the task's YAML",
                         hint="lm-eval tasks run here from local files only (no hub at run time); "
                              "the task is a YAML file there: task: NAME, dataset_path: json, "
                              "dataset_kwargs.data_files naming local files, output_type: generate_until")
    if not task_dir.is_dir():
        raise UsageError(f"--task-dir {task_dir}: no such folder", hint="the folder holding the task's YAML")
    found: dict[str, tuple[Path, dict[str, Any]]] = {}
    for f in sorted(task_dir.rglob("*.y*ml")):
        try:
            doc = yaml.safe_load(f.read_text())
        except (OSError, yaml.YAMLError) as e:
            raise UsageError(f"{f}: not readable YAML: {e}", hint="fix the task file") from None
        if isinstance(doc, dict) and isinstance(doc.get("task"), str):
            found[doc["task"]] = (f, doc)
    if task not in found:
        raise UsageError(f"lm-eval:{task}: no task named {task!r} in {task_dir}",
                         hint="tasks there: " + (", ".join(sorted(found)) or "none (a YAML with `task: NAME`)"))
    f, doc = found[task]
    if doc.get("dataset_path") != "json":
        raise UsageError(f"{f}: dataset_path is {doc.get('dataset_path')!r}; expected json with local data_files",
                         hint="no hub at run time: write the questions to a .jsonl and name it in "
                              "dataset_kwargs.data_files")
    data = (doc.get("dataset_kwargs") or {}).get("data_files")
    names = [data] if isinstance(data, str) else list(data.values()) if isinstance(data, dict) else data or []
    names = [n for x in names for n in ([x] if isinstance(x, str) else x)]
    if not names:
        raise UsageError(f"{f}: dataset_kwargs.data_files is missing", hint="name the task's local .jsonl file(s)")
    files = [(task_dir / n) if not Path(n).is_absolute() else Path(n) for n in names]
    missing = [str(p) for p in files if not p.exists()]
    if missing:
        raise UsageError(f"{f}: data_files not found: {', '.join(missing)}", hint="paths are relative to --task-dir")
    return Task(task, f, str(doc.get("output_type") or "generate_until"), files)


@dataclass(frozen=True)
class LmEvalGate:
    """`--eval lm-eval:TASK`: the share of the task's samples scored 1 must be at least `threshold`."""

    task: str
    task_dir: Optional[Path]
    threshold: float
    limit: Optional[int] = None
    concurrency: int = 8
    timeout_s: float = 600.0  # one request
    name: str = "eval"
    kind: str = "lm-eval"
    file: str = S.FILE
    every_replica: bool = False  # a campaign asks the first replica: the answers are the configuration's

    def fitted(self, served: int, max_output_tokens: Optional[int], model: str) -> "LmEvalGate":
        return self  # asks the same whatever the server serves

    def check(self, engine: Optional[str] = None) -> Task:
        S.check_threshold(self.threshold)
        if self.limit is not None and self.limit < 1:
            raise UsageError(f"--limit must be at least 1, got {self.limit}", hint="or leave it out")
        if self.concurrency < 1:
            raise UsageError(f"--concurrency must be at least 1, got {self.concurrency}")
        t = find_task(self.task, self.task_dir)
        if t.output_type in LOGLIKELIHOOD:
            adapter = all_engines().get(engine) if engine else None  # the engine's facts live on its adapter
            said = adapter.no_prompt_logprobs if adapter is not None else ""
            why = (f"{said}, so such a task would score at chance there" if said else
                   "servedeck runs lm-eval through chat completions, which return no prompt logprobs")
            raise UsageError(f"lm-eval:{self.task} is a {t.output_type} task ({t.yaml}): {why}",
                             hint="use a generative task (output_type: generate_until) or the built-in gate "
                                  "(--eval PATH.jsonl with match = \"choice\" for multiple choice)")
        return t

    def spec_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "task": f"lm-eval:{self.task}", "task_dir": str(self.task_dir),
                "limit": self.limit, "threshold": self.threshold, "concurrency": self.concurrency,
                "model": "local-chat-completions"}

    def argv(self, server: Endpoint, out: Path) -> list[str]:
        args = (f"model={server.served_name},base_url={server.base_url.rstrip('/')}/v1/chat/completions,"
                f"num_concurrent={self.concurrency},max_retries=1,timeout={int(self.timeout_s)}")
        cmd = [sys.executable, "-m", "servedeck.gates.lmeval_child", "run", "--model", CHILD_MODEL, "--model_args", args,
               "--tasks", self.task, "--include_path", str(self.task_dir), "--apply_chat_template",
               "--output_path", str(out), "--log_samples", "--seed", "0"]
        return cmd + (["--limit", str(self.limit)] if self.limit else [])

    async def run(self, server: Endpoint, folder: Path, record: Callable[[dict[str, Any]], None]) -> dict[str, Any]:
        self.check(server.engine)
        out = folder.resolve() / OUT  # absolute: lm-eval runs in the task folder
        out.mkdir(exist_ok=True)
        with tempfile.TemporaryDirectory(prefix="servedeck-lmeval-") as cache, open(out / "lm-eval.log", "wb") as log:
            env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "HF_DATASETS_CACHE": cache,
                   "TOKENIZERS_PARALLELISM": "false", "SERVEDECK_LMEVAL_ERRORS": str(out / REQUEST_ERRORS)}
            proc = await asyncio.create_subprocess_exec(*self.argv(server, out), cwd=str(self.task_dir), env=env,
                                                        stdout=log, stderr=asyncio.subprocess.STDOUT,
                                                        start_new_session=True)
            try:
                rc = await proc.wait()
            except asyncio.CancelledError:  # Ctrl-C: lm-eval and whatever it started go with it
                os.killpg(proc.pid, signal.SIGKILL)
                await proc.wait()
                raise
        if rc != 0:
            tail = (out / "lm-eval.log").read_text(errors="replace").strip().splitlines()[-3:]
            raise RunError(f"lm-eval exited with {rc}: {' | '.join(tail)[-400:]}",
                           hint=f"its whole output: {out / 'lm-eval.log'}")
        errors = _request_errors(out)
        lines = [_line(s, errors) for s in _samples(out, self.task)]
        for line in lines:
            record(line)
        result = S.tally(lines, self.threshold)
        result["lm_eval"] = _reported(out, self.task)
        return result


def _samples(out: Path, task: str) -> list[dict[str, Any]]:
    files = sorted(glob.glob(str(out / "**" / f"samples_{task}_*.jsonl"), recursive=True))
    if not files:
        raise RunError(f"lm-eval finished but wrote no samples for {task} under {out}")
    return [json.loads(x) for x in Path(files[-1]).read_text().splitlines() if x.strip()]


def _reported(out: Path, task: str) -> dict[str, Any]:
    """lm-eval's own figures for the task (metric,filter → value), as its results JSON has them."""
    files = sorted(glob.glob(str(out / "**" / "results_*.json"), recursive=True))
    if not files:
        return {}
    doc = json.loads(Path(files[-1]).read_text())
    return {k: v for k, v in ((doc.get("results") or {}).get(task) or {}).items() if isinstance(v, (int, float))}


def _request_errors(out: Path) -> dict[str, str]:
    """The child's failed requests, by the prompt lm-eval sent (its samples' arg_0)."""
    f = out / REQUEST_ERRORS
    if not f.exists():
        return {}
    found = {}
    for x in f.read_text().splitlines():
        try:
            doc = json.loads(x)
            found[str(doc["prompt"])] = str(doc["error"])
        except (ValueError, KeyError, TypeError):
            continue
    return found


def _line(s: dict[str, Any], errors: Optional[dict[str, str]] = None) -> dict[str, Any]:
    """One lm-eval sample → one eval.jsonl line; a sample whose request failed carries the error."""
    metric = (s.get("metrics") or ["exact_match"])[0]
    value = s.get(metric)
    args = s.get("arguments") or {}
    first = next(iter(args.values()), {}) if isinstance(args, dict) else (args[0] if args else {})
    prompt = (first.get("arg_0") or [""])[0] if isinstance(first, dict) else str(first)
    try:
        messages = json.loads(prompt)
        assert isinstance(messages, list)
    except (ValueError, AssertionError, TypeError):
        messages = [{"role": "user", "content": str(prompt)}]
    answer = (s.get("filtered_resps") or [""])[0]
    raw = [r for rs in (s.get("resps") or []) for r in (rs if isinstance(rs, list) else [rs])]
    error = None
    if FAILED in raw:
        error = (errors or {}).get(str(prompt), "the request failed (lm-eval's log has why)")
    return S.sample_line(str(s.get("doc_id")), messages, str(s.get("target")), str(answer),
                         error is None and isinstance(value, (int, float)) and value == 1, metric=metric,
                         value=value, filter=s.get("filter"), error=error)
