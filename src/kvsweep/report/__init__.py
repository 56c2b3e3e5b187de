"""The sweep report: from cell results to a decision (selection table), with plots as evidence.

`selection.py` decides, `advice.py` says what to roll back, `plots.py` draws, `markdown.py` and
`html_page.py` render, `write.py` puts the files in a folder. A capacity search adds `capacity.py`
(the pick per size), `capacity_csv.py`, `capacity_tables.py` and `capacity_plots.py`; `listing.py`
keeps a search's lone probes out of the decision lists. Inputs are `CellResult`s, so the
same report comes from a live sweep or from MLflow alone (`python -m kvsweep report`).
"""
