"""Reports: the tables once (tables.py; a study's in study_tables.py, the episodes' in episode_tables.py),
the pipeline's report (pipeline.py: markdown and HTML), the seed studies' definition and aggregation
(study.py) and pages (studypage.py), the HTML page and plots (htmlpage.py), the side-by-side table of
runs behind `rung compare` (runs_table.py), the health checks that flag a degenerate experiment
(health.py), and each stage's wall time in a run with its table (timings.py)."""
