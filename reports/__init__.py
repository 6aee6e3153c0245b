"""Reports: tables and figures as pure functions of the results table."""
