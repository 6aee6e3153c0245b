"""Reports: tables, figures and text as pure functions of the results table (no suite code).

results.py     results.csv: append a row whole, read the table (`append_row`, `read_table`)
markdown.py    a run's report.md (`render_report`, `compared`)
tables.py, sections.py, predicted.py, summary.py    markdown tables and sections
figures.py, published.py, validation.py, training.py, autotune.py    figures and sections
html.py, latex.py    report.html (figures embedded), tables/*.tex
progress.py          the progress bar of a long loop
reproduction.py      the experiment=paper reproduction report
"""
