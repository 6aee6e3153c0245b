"""`python -m suite.report DIR` (this package's `__main__`): rebuild a run's report from its
results table. The report's text is `suite.report_md`, which `suite.run` uses too; it lives beside
`run`, not in this package, so that this command may import `run` without an import cycle."""
