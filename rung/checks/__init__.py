"""Checks of params made before any compute, one module per concern: each stage's flow runs the
checks of what it runs (so its DVC deps stay what it imports), and rung.preflight runs them all."""
