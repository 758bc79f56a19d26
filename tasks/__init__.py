"""Prefect tasks: each wraps one call into the rung core and reports through Prefect's logger."""
