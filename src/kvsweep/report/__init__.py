"""The sweep report: from cell results to a decision (selection table), with plots as evidence.

`selection.py` decides, `advice.py` says what to roll back, `plots.py` draws, `markdown.py` and `html_page.py`
render, `report_files.py` writes the folder; `capacity_assessment.py` and `capacity_report.py` add a capacity
search's picks, tables and figure. Inputs are `CellResult`s, so the same report comes from a live sweep or from
MLflow alone (`python -m kvsweep report`).
"""
