"""Reports: the pipeline's report (markdown and HTML), the seed studies' pages, the side-by-side table
of runs, and the health checks that flag a degenerate experiment."""
