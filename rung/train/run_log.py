"""A training stage's per-step logs in its MLflow run, through a tracking server that goes away.

Replaces transformers' MLflowCallback, whose asynchronous queue drops a batch the server did not
take (and which opens a run of its own when none is active). Here a background thread sends the logs,
keeps what the server did not take and retries, so training never waits on the server; each
(metric, step) is sent once; and a resumed or rerun stage sends what its checkpoint's log history
(trainer_state.json keeps every logged step) holds and the server lacks. A stage whose server stays
away past `tracking.outage_wait` fails at its end with its checkpoints kept, and its rerun completes
the record (rung.tracking.stage_run reopens the stage's run).
"""

from __future__ import annotations

import os
import re
import sys
import threading
import time
from typing import Any

import mlflow
from mlflow.entities import Metric, Param
from mlflow.exceptions import RestException
from transformers import TrainerCallback

from rung.errors import Unavailable
from rung.redaction import redact

RETRY_S = 5.0  # between tries while the server does not answer (each try is MLflow's own, with its retries)
BATCH = 1000  # MLflow's limit of metrics per log_batch
PARAM_BATCH = 100  # and of params
MAX_PARAM = 6000  # MLflow's longest param value


def _key(name: str) -> str:
    return re.sub(r"[^0-9A-Za-z_\-\.\ :/]", "_", name)  # the names MLflow accepts, as transformers makes them


def _numbers(logs: dict[str, Any]) -> dict[str, float]:
    out = {}
    for k, v in logs.items():
        if hasattr(v, "numel") and v.numel() == 1:
            v = v.item()
        if isinstance(v, int | float) and not isinstance(v, bool) and k != "step":
            out[_key(k)] = float(v)
    return out


class RunLog(TrainerCallback):
    """Sends the trainer's logs (and, once, its arguments as params) to MLflow run `run_id` from the
    main process; `close` waits up to `wait_s` for the server to take what is left."""

    def __init__(self, run_id: str, wait_s: float) -> None:
        self.run_id, self.wait_s = run_id, wait_s
        self.client = mlflow.MlflowClient()
        self.uri = redact(mlflow.get_tracking_uri())
        self._cond = threading.Condition()
        self._metrics: list[Metric] = []
        self._params: list[Param] = []
        self._known: set[tuple[str, int]] = set()  # (key, step) sent or waiting
        # the keys an earlier attempt of the run logged (a rerun reopens it), with their steps once read
        self._earlier: dict[str, set[int] | None] | None = None
        self._earlier_params: set[str] = set()
        self._closing = False
        self.error: str | None = None  # why the last send failed; None once one succeeds
        self._failing_since: float | None = None  # monotonic time of the first of the failures going on
        self._thread = threading.Thread(target=self._loop, name="rung-mlflow", daemon=True)
        self._thread.start()

    @classmethod
    def of_active_run(cls, wait_s: float) -> RunLog | None:
        """For the active run (in-process stage) or MLFLOW_RUN_ID (a rank of a distributed job); None
        when there is neither (a trainer used outside a stage logs nowhere)."""
        run = mlflow.active_run()
        run_id = run.info.run_id if run else os.environ.get("MLFLOW_RUN_ID")
        return cls(run_id, wait_s) if run_id else None

    def add(self, logs: dict[str, Any], step: int, when: int | None = None) -> None:
        """Queue the numbers of one log call at `step` (a (key, step) already queued or sent is skipped)."""
        when = when or int(time.time() * 1000)
        with self._cond:
            for k, v in _numbers(logs).items():
                if (k, step) not in self._known:
                    self._known.add((k, step))
                    self._metrics.append(Metric(k, v, when, step))
            self._cond.notify_all()

    def add_history(self, history: list[dict[str, Any]]) -> None:
        """Queue a checkpoint's log history (TrainerState.log_history: each entry has its 'step')."""
        for entry in history:
            self.add(entry, int(entry.get("step", 0)))

    def on_train_begin(self, args: Any, state: Any, control: Any, model: Any = None, **_: Any) -> None:
        if not state.is_world_process_zero:
            return
        config = model.config.to_dict() if getattr(model, "config", None) is not None else {}
        values = {_key(k): str(v) for k, v in {**config, **args.to_dict()}.items()}
        with self._cond:
            self._params = [Param(k, v) for k, v in values.items() if len(v) <= MAX_PARAM]
        self.add_history(state.log_history)  # a resumed run's steps before its checkpoint

    def on_log(self, args: Any, state: Any, control: Any, logs: dict[str, Any] | None = None, **_: Any) -> None:
        if state.is_world_process_zero and logs:
            self.add(logs, state.global_step)

    def _first_contact(self) -> None:
        """What an earlier attempt of this run (a rerun reopens it) already logged: its params, and which
        keys have metrics (their steps are read when a batch has them)."""
        run = self.client.get_run(self.run_id)
        self._earlier_params = set(run.data.params)
        self._earlier = dict.fromkeys(run.data.metrics)

    def _new(self, batch: list[Metric]) -> list[Metric]:
        assert self._earlier is not None
        out = []
        for m in batch:
            if m.key in self._earlier:
                steps = self._earlier[m.key]
                if steps is None:
                    steps = self._earlier[m.key] = {h.step for h in self.client.get_metric_history(self.run_id, m.key)}
                if m.step in steps:
                    continue
            out.append(m)
        return out

    def _loop(self) -> None:
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._metrics or self._params or self._closing)
                if not (self._metrics or self._params):
                    return
                metrics, params = self._metrics[:BATCH], self._params[:PARAM_BATCH]
            try:
                self._send(metrics, params)
            except RestException as e:  # the server answered and refused the batch: sending it again cannot help
                print(f"MLflow at {self.uri} refused {len(metrics)} metrics: {e}", file=sys.stderr, flush=True)
            except Exception as e:  # noqa: BLE001 - no answer: keep the batch, try again
                if self.error is None:
                    print(
                        f"MLflow at {self.uri} does not answer ({str(e)[:200]}); training goes on, "
                        "its logs are kept and sent when the server is back",
                        file=sys.stderr,
                        flush=True,
                    )
                self.error = str(e)[:200]
                if self._failing_since is None:
                    self._failing_since = time.monotonic()
                with self._cond:
                    self._cond.wait(RETRY_S)
                continue
            with self._cond:
                del self._metrics[: len(metrics)]
                del self._params[: len(params)]
            if self.error is not None:
                print(f"MLflow at {self.uri} is back; sending the kept logs", file=sys.stderr, flush=True)
                self.error, self._failing_since = None, None

    def _send(self, metrics: list[Metric], params: list[Param]) -> None:
        if self._earlier is None:
            self._first_contact()
        new = [p for p in params if p.key not in self._earlier_params]
        if new:
            try:
                self.client.log_batch(self.run_id, params=new)
            except RestException as e:  # refused (a second value for a param): the metrics still go
                print(f"MLflow at {self.uri} refused the trainer's arguments as params: {e}", file=sys.stderr)
        if metrics:
            self.client.log_batch(self.run_id, metrics=self._new(metrics))

    def pending(self) -> int:
        with self._cond:
            return len(self._metrics)

    def close(self, where: str) -> None:
        """Wait until the server has taken everything. Past `wait_s` seconds without an answer from it
        (time it spends taking the logs does not count) raise Unavailable, naming `where` the
        checkpoints are kept for the rerun."""
        with self._cond:
            self._closing = True
            self._cond.notify_all()
        started, told = time.monotonic(), False
        while self._thread.is_alive():
            failing = self._failing_since
            if failing is not None and time.monotonic() - max(failing, started) >= self.wait_s:
                raise Unavailable(
                    f"MLflow at {self.uri} did not take {self.pending()} metrics within tracking.outage_wait = "
                    f"{self.wait_s:g} s ({self.error}); the trained checkpoint is kept in {where}: rerun the stage "
                    "when the server is back, and it sends them"
                )
            if failing is not None and not told:
                print(
                    f"waiting up to {self.wait_s:.0f} s (tracking.outage_wait) for MLflow at {self.uri} "
                    f"to take {self.pending()} metrics",
                    file=sys.stderr,
                    flush=True,
                )
                told = True
            self._thread.join(timeout=0.2)
