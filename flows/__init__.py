"""Prefect flows: one per DVC stage (`python -m flows.<stage>`), plus the pipeline flow."""

import logging
import os

# No network here and no reason to phone home; must be set before prefect is imported.
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
os.environ.setdefault("DO_NOT_TRACK", "1")
# Let the core library's logger reach Prefect's run logs.
os.environ.setdefault("PREFECT_LOGGING_EXTRA_LOGGERS", "rung")
logging.getLogger("rung").setLevel(logging.INFO)  # Prefect gives extra loggers its handlers, not a level
# Without PREFECT_API_URL every stage starts an ephemeral server. In a new PREFECT_HOME that first start
# creates and migrates the database, which takes longer than Prefect's 20 s default on 2 cores.
os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "600")
