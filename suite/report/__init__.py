"""`python -m suite.report DIR` (this package's `__main__`): rebuild a run's report from its
results table, with the report step `suite.run.report` that a run uses (the text is
`reports.markdown`'s)."""
