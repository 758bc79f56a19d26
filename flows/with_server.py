"""One Prefect API for a whole run: `python -m flows.with_server CMD ...` runs CMD with PREFECT_API_URL
pointing at a private server that lives as long as CMD (or at the server PREFECT_API_URL already
names). `make demo` and `make pipeline` use it, so the stages DVC starts share one server instead
of each starting (and, on a new machine, migrating) an ephemeral one.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from prefect.server.api.server import SubprocessASGIServer
from prefect.settings import get_current_settings

from rung.report import timings

# A new Prefect home's database is created and migrated on the first start: ~30 s on 2 cores.
STARTUP_TIMEOUT_S = 600


def run(cmd: list[str], cwd: Path | None = None, env: dict[str, str] | None = None) -> int:
    """Run `cmd` (in `cwd`, with environment `env`, default this one) against a Prefect API; returns its exit code.
    In a DVC workspace, this process's start is the run's for the stage wall-time table (rung.report.timings)."""
    env = env or dict(os.environ)
    if ((cwd or Path.cwd()) / "dvc.yaml").is_file():
        timings.begin(cwd or Path("."))
    if get_current_settings().api.url:
        return subprocess.run(cmd, cwd=cwd, env=env, check=False).returncode
    server = SubprocessASGIServer()
    print(
        "prefect: starting a server for this run (the first start in a new PREFECT_HOME also creates its database)",
        file=sys.stderr,
        flush=True,
    )
    server.start(timeout=STARTUP_TIMEOUT_S)
    try:
        return subprocess.run(cmd, cwd=cwd, env={**env, "PREFECT_API_URL": server.api_url}, check=False).returncode
    finally:
        server.stop()


if __name__ == "__main__":
    if len(sys.argv) < 2:
        raise SystemExit("usage: python -m flows.with_server CMD [ARGS ...]")
    raise SystemExit(run(sys.argv[1:]))
