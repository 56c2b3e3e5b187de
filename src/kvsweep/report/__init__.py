"""The sweep report: from cell results to a decision (selection table), with plots as evidence.

`selection.py` decides, `advice.py` says what to roll back, `plots.py` draws, `markdown.py` and
`html_page.py` render, `report_files.py` puts the files in a folder. A capacity search adds
`capacity_assessment.py` (the pick per size) and `capacity_report.py` (its tables, capacity.csv and
figure); `decision_list.py` keeps a search's lone probes out of the decision lists. Inputs
are `CellResult`s, so the same report comes from a live sweep or from MLflow alone (`python -m kvsweep
report`).
"""
