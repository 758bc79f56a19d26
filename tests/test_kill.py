"""Kill anywhere: a stage SIGKILLed at seeded random moments (start-up, generation, the optimizer
step, a checkpoint write, the final save) and rerun after each kill resumes from its last complete
checkpoint with its curriculum state, and ends where an unkilled run ends: the same per-step curves,
metrics and weights, a loadable model, and no MLflow run left RUNNING.

Each attempt is the stage's own entry (`flows.stage.main`, what `python -m flows.rl main` runs) in a
process forked from a server that imported torch, TRL, Prefect and MLflow once (multiprocessing's
forkserver), so a rerun costs its real start-up work without ~7 s of imports.
"""

from __future__ import annotations

import multiprocessing
import multiprocessing.forkserver
import os
import random
import re
import shutil
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import mlflow
import pytest
import torch
import transformers.trainer
import yaml
from transformers import TrainerState

from flows import serve as team
from rung import files, models, paths
from rung.config import DifficultyParams, FormatParams, RLStageParams, SolutionTraces
from rung.data import traces
from rung.rl import trainers
from rung.train.checkpoints import CURRICULUM_STATE, FINAL, complete_checkpoints
from rung.train.jobs import RLJob
from rung.train.run_log import RunLog
from tests.conftest import free_port, serve, wait_healthy
from tests.rows import sums
from tests.test_pipeline import tiny_params
from tests.workspace import make_workspace

# One workspace, forkserver and MLflow server (the module's fixtures), in file order: on one xdist worker.
pytestmark = pytest.mark.xdist_group("kill")


def parity(completion_ids, **_):
    """A reward with variance inside the groups of a random model (its completions all run to the
    length limit), so that the steps have a gradient."""
    return [float(sum(ids) % 2) for ids in completion_ids]


RL_STEPS, RL_KILLS = 12, 10
OUTAGE_STEPS = 6  # the MLflow outage test's RL stage: the server goes away after step 2
SFT_STEPS, SFT_KILLS = 12, 3
RL_COMPLETE = ("trainer_state.json", CURRICULUM_STATE)  # as rung.train.launch.train decides for RL jobs
ROWS = sums(16, lambda i: i % 3, solutions=True, graded=True)


def _run_stage(ws: str, flow_module: str, args: tuple[str, ...], log: str, env: dict[str, str]) -> None:
    """The body of `python -m flows.<stage> ARGS`, run in `ws` with its output in `log` and `env` added
    to its environment."""
    import importlib

    from flows.stage import main

    os.environ.update(env)
    os.chdir(ws)
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    module = importlib.import_module(flow_module)
    main(getattr(module, flow_module.rsplit(".", 1)[1]), *args)


@pytest.fixture(scope="module")
def forked(prefect_server):
    """A multiprocessing context whose processes fork from a server that preloaded the stages' imports,
    with the Prefect server's settings in its environment (Prefect reads them when imported)."""
    saved = dict(os.environ)
    os.environ.update(prefect_server)
    os.environ.pop("MLFLOW_TRACKING_URI", None)  # the default store: sqlite at <workspace>/mlflow.db
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(["flows.rl", "flows.sft", "tests.test_kill"])
    yield ctx
    multiprocessing.forkserver._forkserver._stop()  # its preloaded memory is not needed by later tests
    os.environ.clear()
    os.environ.update(saved)


@dataclass
class Attempt:
    """One run of the stage: when it was killed (None: it ran to the end) and what it left."""

    trigger: str
    killed_after_s: float | None = None
    resumed_from: int | None = None
    complete_seen: int = 0  # the newest complete checkpoint seen while it ran (or resumed from)
    complete_after: list[int] = field(default_factory=list)
    pid: int = 0
    exitcode: int | None = None
    log: str = ""


class Stage:
    """A stage in a prepared workspace, started (and killed) as its own process."""

    def __init__(
        self,
        ctx,
        ws: Path,
        flow_module: str,
        args: tuple[str, ...],
        name: str,
        complete: tuple[str, ...],
        env: dict[str, str] | None = None,
    ):
        self.ctx, self.ws, self.flow_module, self.args, self.complete = ctx, ws, flow_module, args, complete
        self.env = env or {}
        self.work, self.out = ws / paths.WORK / name, paths.checkpoint(name)
        self.attempts: list[Attempt] = []

    def steps(self) -> list[int]:
        return [int(c.name.rsplit("-", 1)[1]) for c in complete_checkpoints(self.work, self.complete)]

    def run(self, trigger: str, until, on_poll=None, expect_exit: int = 0) -> Attempt:
        """Start the stage; SIGKILL it once `until(started_at)` is true (never, when None)."""
        log = self.ws / "logs" / self.flow_module / f"{len(self.attempts)}.log"
        log.parent.mkdir(parents=True, exist_ok=True)
        log.touch()  # a kill may come before the stage opens it
        attempt = Attempt(trigger, complete_seen=max(self.steps(), default=0))
        started = time.time()
        proc = self.ctx.Process(target=_run_stage, args=(str(self.ws), self.flow_module, self.args, str(log), self.env))
        proc.start()
        attempt.pid = proc.pid
        while proc.exitcode is None:
            attempt.complete_seen = max(attempt.complete_seen, *self.steps(), 0)
            if on_poll:
                on_poll()
            if until is not None and until(started):
                proc.kill()
                attempt.killed_after_s = round(time.time() - started, 2)
                break
            time.sleep(0.01)
        proc.join()
        attempt.exitcode = proc.exitcode
        text = log.read_text()
        found = re.search(r"resuming from \S*checkpoint-(\d+)", text)
        attempt.resumed_from = int(found.group(1)) if found else None
        attempt.complete_after = self.steps() if self.work.exists() else []
        self.attempts.append(attempt)
        print(f"{time.time() - started:6.2f}s {attempt}", flush=True)
        attempt.log = text
        if attempt.killed_after_s is None and expect_exit == 0:
            assert attempt.exitcode == 0, text[-4000:]
        return attempt


@pytest.fixture(scope="module")
def ws(tmp_path_factory, tiny_model) -> Path:
    """A workspace holding the inputs of the sft and rl@main stages (the tiny model, traces, scored
    prompts), and one MLflow store for both tests."""
    ws = tmp_path_factory.mktemp("kill") / "ws"
    ws.mkdir()
    params = tiny_params(tiny_model)
    params["sft"].update(max_steps=SFT_STEPS, save_steps=2, per_device_train_batch_size=2)
    params["rl"]["stages"]["main"].update(
        max_steps=RL_STEPS,
        save_steps=1,
        num_generations=4,
        beta=0.0,
        max_completion_length=6,
        rewards={"accuracy": 1.0, "parity": {"import": "tests.test_kill:parity"}},
    )
    make_workspace(ws, params, dict(os.environ), stages=["sft", "rl"])
    for name in ("base", "sft"):
        shutil.copytree(tiny_model, ws / paths.checkpoint(name))
    files.write_jsonl(ws / paths.FILTERED, ROWS)
    files.write_jsonl(
        ws / paths.TRACES, traces.from_solutions(ROWS, SolutionTraces(), FormatParams(**params.get("format", {})))
    )
    return ws


def _new(path: Path, since: float) -> bool:
    """Whether directory `path` got an entry since time `since` (this attempt started writing it)."""
    try:
        return path.stat().st_mtime >= since
    except FileNotFoundError:
        return False


def _plan(rng: random.Random, steps: int, save_steps: int, kills: int) -> list[tuple[str, int]]:
    """Kill triggers: one during start-up, one in the final save, and between them kills at random
    checkpoints, some as it starts being written, the others at a random moment after it."""
    targets = sorted(rng.sample(range(save_steps, steps, save_steps), kills - 2))
    kinds = ["write"] * max(1, len(targets) // 3) + ["step"] * (len(targets) - max(1, len(targets) // 3))
    rng.shuffle(kinds)
    return [("startup", 0), *zip(kinds, targets, strict=True), ("final", steps)]


def _kill_and_rerun(stage: Stage, rng: random.Random, steps: int, save_steps: int, kills: int, keep) -> None:
    """Run the stage once unkilled (`keep` saves what it produced; its timings place the kills), then
    kill it `kills` times at seeded random moments, rerunning after each, and let the last run end."""
    states: dict[int, object] = {}  # the curriculum state of each checkpoint of the unkilled run
    seen: dict[int, float] = {}  # when each checkpoint was complete
    t0 = time.time()

    def observe() -> None:
        for step in stage.steps():
            seen.setdefault(step, time.time() - t0)
            state = stage.work / f"checkpoint-{step}" / CURRICULUM_STATE
            if step not in states and CURRICULUM_STATE in stage.complete and state.is_file():
                states[step] = files.read_json(state)

    stage.run("none (reference)", None, on_poll=observe)
    print("reference: checkpoints complete at", {k: round(v, 2) for k, v in seen.items()})
    keep()
    first = min(seen)
    step_s = (seen[steps] - seen[first]) / (steps - first)
    for kind, target in _plan(rng, steps, save_steps, kills):
        r = max(stage.steps(), default=0)
        if r and CURRICULUM_STATE in stage.complete:  # the state resumed from is the unkilled run's at that step
            assert files.read_json(stage.work / f"checkpoint-{r}" / CURRICULUM_STATE) == states[r], r
        target, delay = max(target, r + save_steps), 0.0
        # No trigger waits past the start of the next checkpoint, so each kill leaves the next
        # target ahead: kills are spread over the steps, never bunched at the end.
        if kind == "startup":  # a random moment of start-up (imports excepted) or of the first steps
            # (the unkilled run's start-up also created the MLflow store: a rerun's took about a quarter)
            delay = rng.uniform(0, seen[first] / 4)

            def until(t, d=delay, nxt=stage.work / f"checkpoint-{r + save_steps}"):
                return time.time() - t >= d or _new(nxt, t)

        elif kind == "final" or target >= steps:  # the final save, the publishing or the clean-up
            kind, target = "final", steps
            until = lambda t, r=r: _new(stage.work / FINAL, t) or (r < steps and steps in stage.steps())  # noqa: E731
        elif kind == "write":  # the checkpoint directory got its first entry in this attempt
            until = lambda t, d=stage.work / f"checkpoint-{target}": _new(d, t)  # noqa: E731
        else:  # a random moment of the steps after a complete checkpoint, before the next one is complete
            delay = rng.uniform(0, step_s * save_steps)
            reached: list[float] = []

            def until(t, s=target, d=delay, reached=reached):
                if not reached and s in stage.steps():
                    reached.append(time.time())
                return bool(reached) and (
                    time.time() - reached[0] >= d or _new(stage.work / f"checkpoint-{s + save_steps}", t)
                )

        before = stage.attempts[-1]
        attempt = stage.run(f"{kind} {target}" + (f" +{delay:.2f}s" if delay else ""), until)
        assert attempt.killed_after_s is not None, f"the stage ended before the kill: {attempt}"
        # it resumed from the newest complete checkpoint the kill before left (none: from the start) ...
        assert attempt.resumed_from == max(before.complete_after, default=None), (before, attempt)
        # ... and a kill never takes away the newest complete checkpoint (but for the clean-up after
        # the model was published: then the next run trains again from the start)
        assert max(attempt.complete_after, default=0) >= attempt.complete_seen or (
            not stage.work.exists() and (stage.ws / stage.out / "rung.json").is_file()
        ), attempt
    last = stage.run("none (last)", None)
    assert last.resumed_from == max(stage.attempts[-2].complete_after, default=None), last
    print(f"{stage.flow_module}: {len(stage.attempts) - 2} kills; one step of the unkilled run {step_s:.2f}s")


def _runs(ws: Path) -> list:
    mlflow.set_tracking_uri(f"sqlite:///{ws / 'mlflow.db'}")
    return mlflow.search_runs(experiment_names=["rung"], output_format="list")


def _check_tracking(stage: Stage, run_name: str, steps: int) -> None:
    """No run stays RUNNING, and each rerun after a kill reopened the stage run of the attempt it
    resumes (rung.tracking.stage_run): the unkilled reference run and that one, both FINISHED (the
    last attempt their owner), each with the loss of every step exactly once."""
    runs = _runs(stage.ws)
    assert not [(r.info.run_name, r.data.tags.get("rung.owner")) for r in runs if r.info.status == "RUNNING"]
    assert len([r for r in runs if r.data.tags["rung.role"] == "pipeline"]) == 1
    mine = sorted((r for r in runs if r.info.run_name == run_name), key=lambda r: r.info.start_time)
    assert [r.info.status for r in mine] == ["FINISHED", "FINISHED"], mine
    assert int(mine[1].data.tags["rung.owner"].rpartition(":")[2].split("-")[0]) == stage.attempts[-1].pid
    client = mlflow.MlflowClient()
    for run in mine:
        assert sorted(m.step for m in client.get_metric_history(run.info.run_id, "loss")) == list(range(1, steps + 1))


def _check_outcome(ws: Path, model: str, plot: tuple[str, str], metrics: str, reference: Path, steps: int) -> None:
    """The stage's outputs equal the unkilled run's: model weights, per-step curves, metrics."""
    out = ws / paths.checkpoint(model)
    got, want = models.load(out)[0].state_dict(), models.load(reference / "model")[0].state_dict()
    assert got.keys() == want.keys()
    for k in got:
        torch.testing.assert_close(got[k], want[k], msg=k)
    if plot:
        assert files.read_json(ws / paths.plot(*plot)) == files.read_json(reference / "curves.json")
    assert files.read_json(ws / paths.metrics(metrics)) == files.read_json(reference / "metrics.json")
    assert files.read_json(ws / paths.metrics(metrics))["steps"] == steps
    assert files.read_json(ws / paths.metrics(metrics))["weights_changed_share"] > 0.99  # and it trained
    assert not (ws / paths.WORK / model).exists()


def _keeper(ws: Path, model: str, plot: tuple[str, str] | None, metrics: str, reference: Path):
    def keep() -> None:
        shutil.copytree(ws / paths.checkpoint(model), reference / "model")
        if plot:
            shutil.copy(ws / paths.plot(*plot), reference / "curves.json")
        shutil.copy(ws / paths.metrics(metrics), reference / "metrics.json")

    return keep


def test_rl_stage_killed_ten_times_ends_as_if_never_killed(forked, ws, tmp_path):
    stage = Stage(forked, ws, "flows.rl", ("main",), "rl/main", RL_COMPLETE)
    args = (ws, "rl/main", ("rl", "main"), "rl-main", tmp_path / "reference")
    _kill_and_rerun(stage, random.Random(0), RL_STEPS, 1, RL_KILLS, _keeper(*args))
    _check_outcome(*args, RL_STEPS)
    _check_tracking(stage, "rl@main", RL_STEPS)


def test_sft_stage_killed_three_times_ends_as_if_never_killed(forked, ws, tmp_path):
    stage = Stage(forked, ws, "flows.sft", (), "sft", ("trainer_state.json",))
    args = (ws, "sft", None, "sft", tmp_path / "reference")
    _kill_and_rerun(stage, random.Random(1), SFT_STEPS, 2, SFT_KILLS, _keeper(*args))
    _check_outcome(*args, SFT_STEPS)
    _check_tracking(stage, "sft", SFT_STEPS)


class TrackingServer:
    """An MLflow server on loopback (`rung serve`'s command line, without auth) that a test stops and
    starts again on the same port and store: the team's server going away and coming back."""

    def __init__(self, state: Path) -> None:
        self.state, where = state, team.Endpoints("127.0.0.1", "127.0.0.1", 0, free_port())
        self.url = where.mlflow
        self.cmd, extra = team.commands(where, state, None)["mlflow"]
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("MLFLOW_")} | extra
        self.proc = None

    def start(self) -> None:
        log = self.state / "mlflow.log"
        self.proc = serve(self.cmd, self.env, log)
        wait_healthy(self.proc, f"{self.url}/health", log)

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.terminate()
            self.proc.wait(timeout=30)
            self.proc = None


@pytest.fixture(scope="module")
def tracking_server(tmp_path_factory):
    server = TrackingServer(tmp_path_factory.mktemp("mlflow-server"))
    server.start()
    yield server
    server.stop()


NO_WAITING = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "0", "MLFLOW_HTTP_REQUEST_TIMEOUT": "5"}  # a try fails at once


def _loss_steps(client: mlflow.MlflowClient, run_id: str) -> list[int]:
    return sorted(m.step for m in client.get_metric_history(run_id, "loss"))


def test_the_trainer_log_keeps_what_an_absent_server_did_not_take_and_sends_each_step_once(
    tracking_server, monkeypatch
):
    """rung.train.run_log: logs made while the server is away are sent when it is back (here while
    the end of training waits for it), and a rerun's log history is sent only where the run lacks it."""
    for k, v in NO_WAITING.items():
        monkeypatch.setenv(k, v)
    mlflow.set_tracking_uri(tracking_server.url)
    client = mlflow.MlflowClient()
    run_id = client.create_run(client.create_experiment("outage")).info.run_id
    log, state = RunLog(run_id, wait_s=120), TrainerState()

    def step(n: int, loss: float) -> None:
        state.global_step = n
        log.on_log(None, state, None, logs={"loss": loss, "epoch": n / 10})

    for n in (1, 2):
        step(n, 1.0 / n)
    while log.pending():
        time.sleep(0.05)
    tracking_server.stop()
    for n in (3, 4):
        step(n, 1.0 / n)
    step(4, 99.0)  # a second value for a (key, step) is not sent
    back = threading.Timer(2, tracking_server.start)
    back.start()
    log.close("the work dir")
    back.join()
    assert _loss_steps(client, run_id) == [1, 2, 3, 4] and log.error is None
    assert {m.step: m.value for m in client.get_metric_history(run_id, "loss")}[4] == 0.25

    rerun = RunLog(run_id, wait_s=60)  # a rerun reopened the run; its checkpoint's history goes to step 5
    rerun.add_history([{"loss": 1.0 / n, "step": n} for n in range(1, 6)])
    rerun.close("the work dir")
    assert _loss_steps(client, run_id) == [1, 2, 3, 4, 5]


def test_an_rl_stage_whose_mlflow_server_went_away_keeps_its_checkpoint_and_its_rerun_completes_the_record(
    forked, ws, tracking_server
):
    """The server goes away after step 2 and stays away past tracking.outage_wait: training goes on,
    the stage fails in one line (exit 75) keeping its trained checkpoint; once the server is back the
    rerun trains nothing, reopens the stage run and sends what it lacks: every step once, one run."""
    params = yaml.safe_load((ws / "params.yaml").read_text())
    params.setdefault("tracking", {})["outage_wait"] = 1
    params["rl"]["stages"]["main"].update(max_steps=OUTAGE_STEPS, save_steps=2)
    (ws / "params.yaml").write_text(yaml.safe_dump(params))
    stage = Stage(
        forked,
        ws,
        "flows.rl",
        ("main",),
        "rl/main",
        RL_COMPLETE,
        env={"MLFLOW_TRACKING_URI": tracking_server.url, **NO_WAITING},
    )

    def away_after_step_two() -> None:
        if tracking_server.proc is not None and 2 in stage.steps():
            tracking_server.stop()

    first = stage.run("mlflow away from step 2", None, on_poll=away_after_step_two, expect_exit=75)
    tail = first.log.strip().splitlines()[-1]
    assert first.exitcode == 75 and tail.startswith("error: MLflow at ") and "tracking.outage_wait" in tail, first.log[
        -3000:
    ]
    assert first.complete_after[-1] == OUTAGE_STEPS  # trained to the end, checkpoint kept

    tracking_server.start()
    second = stage.run("mlflow back", None)
    assert second.resumed_from == OUTAGE_STEPS and "reopening the stage run" in second.log
    mlflow.set_tracking_uri(tracking_server.url)
    runs = mlflow.search_runs(experiment_names=["rung"], output_format="list")
    [run] = [r for r in runs if r.info.run_name == "rl@main"]
    assert run.info.status == "FINISHED" and run.data.metrics["rl/steps"] == OUTAGE_STEPS
    assert _loss_steps(mlflow.MlflowClient(), run.info.run_id) == list(range(1, OUTAGE_STEPS + 1))
    assert not (ws / paths.WORK / "rl/main").exists()  # discarded once the record was complete


class _Killed(BaseException):
    """Stands for SIGKILL inside the process: nothing after it runs (the in-process tests below)."""


def test_a_kill_after_trl_rotated_its_checkpoints_leaves_a_complete_one(tiny_model, tmp_path, monkeypatch):
    """Regression: TRL deletes the previous checkpoint at the end of its save, and rung wrote the
    curriculum state after that, so a kill in between left no complete RL checkpoint (a rerun
    started over). And a rerun from the checkpoint of the last step trained one step past max_steps."""
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlflow.db'}")
    stage = RLStageParams.model_validate(
        {
            "max_steps": 2,
            "num_generations": 2,
            "prompts_per_step": 2,
            "max_completion_length": 4,
            "save_steps": 1,
            "curriculum": {"type": "pools"},
            "rewards": {"parity": {"import": "tests.test_kill:parity"}},
        }
    )
    files.write_jsonl(tmp_path / "rows.jsonl", ROWS)
    job = RLJob(
        key="rl.stages.main",
        params=stage,
        format=FormatParams(),
        seed=7,
        dtype="float32",
        init=tiny_model,
        data=tmp_path / "rows.jsonl",
        work_dir=tmp_path / "work",
        buckets=DifficultyParams().buckets,
        curves=tmp_path / "curves.json",
    )
    rotate = transformers.trainer.rotate_checkpoints

    def rotate_then_die(output_dir, **kw):
        rotate(output_dir, **kw)
        if (Path(output_dir) / "checkpoint-2").exists():
            raise _Killed

    monkeypatch.setattr(transformers.trainer, "rotate_checkpoints", rotate_then_die)
    with pytest.raises(_Killed):
        trainers.train(job)
    assert mlflow.active_run() is None  # a trainer outside a stage run opens none (rung.train.run_log)
    done = complete_checkpoints(job.work_dir, RL_COMPLETE)
    assert [c.name for c in done] == ["checkpoint-2"]
    monkeypatch.undo()
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlflow.db'}")
    summary = trainers.train(job.model_copy(update={"resume": str(done[-1])})).metrics
    assert summary["steps"] == 2 and [c["step"] for c in files.read_json(job.curves)] == [1, 2]


def test_a_torn_trainer_state_is_not_a_complete_checkpoint(tmp_path):
    for step, state in ((1, '{"global_step": 1}'), (2, '{"global_step": 2, "log_hi')):  # 2: killed while writing it
        (tmp_path / f"checkpoint-{step}").mkdir()
        (tmp_path / f"checkpoint-{step}" / "trainer_state.json").write_text(state)
    assert [c.name for c in complete_checkpoints(tmp_path)] == ["checkpoint-1"]
