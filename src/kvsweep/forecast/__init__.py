"""A cell's time, forecast before it runs: first-principles terms (`terms`), the device figures they divide by
(`gpu_datasheet`) and the sustained fractions that turn a datasheet peak into what a run gets (`sustained`).

Pure arithmetic on figures the planner already has: nothing here imports torch, Ray, the driver or the CLI, so a
dry run on any machine can forecast a GPU sweep.
"""
