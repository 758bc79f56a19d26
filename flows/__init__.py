"""Prefect flows: one per DVC stage (`python -m flows.<stage>`), plus the pipeline flow."""
import os

# No network here and no reason to phone home; must be set before prefect is imported.
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
os.environ.setdefault("DO_NOT_TRACK", "1")
# Let the core library's logger reach Prefect's run logs.
os.environ.setdefault("PREFECT_LOGGING_EXTRA_LOGGERS", "rung")
