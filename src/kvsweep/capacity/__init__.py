"""Capacity frontiers: how far each cache goes (largest batch or context that fits and meets an SLO).

Pure functions of cell results and settings, below the driver and the report, which both use them: the
driver to choose each search's next probe, the report to rebuild the frontiers from results alone.
"""
