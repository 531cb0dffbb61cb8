"""Reading results: the sweep report, the benchmark, encoding plots and tables."""
