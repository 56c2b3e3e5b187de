"""`dry_run=true`: the grid and each cell's plan, with `device=auto` resolved exactly as a run would.

A run resolves `auto` from the Ray cluster's GPUs. Joining a cluster (`ray.address`), the dry run asks
that cluster (a driver connection, no actor); otherwise a run would start a local instance holding
this machine's GPUs, so the dry run counts those. Nothing is measured or logged.
"""

import os
import sys
from typing import TYPE_CHECKING, TextIO

from kvsweep.config.schema import KvSweepConfig
from kvsweep.config.tool_variables import LOCAL_RAY
from kvsweep.driver import ray_session
from kvsweep.driver.capacity_search import plan_searches, search_text
from kvsweep.driver.first_lines import first_lines
from kvsweep.driver.sweep_forecast import forecast_sweep, scheduler_slots, search_probes
from kvsweep.forecast.sweep_bill import cell_lines
from kvsweep.plan.memory_fit import local_gpu_bytes
from kvsweep.plan.sweep_plan import plan_limits, plan_sweep, plan_text, protocol_of, sweep_workload
from kvsweep.redact import redact_text

if TYPE_CHECKING:
    from kvsweep.driver.inputs_choice import InputsChoice


def dry_run(cfg: KvSweepConfig, out: TextIO | None = None, inputs: "InputsChoice | None" = None) -> int:
    """`inputs`: what each model is fed, when the caller chose it already (else chosen here)."""
    from kvsweep.driver.inputs_choice import choose_inputs

    inputs = inputs or choose_inputs(cfg)
    # An explicit device is planned as asked, even where it is absent (plan a GPU sweep from a laptop).
    device = (
        cfg.device if cfg.device != "auto" else ray_session.resolve_device("auto", cluster_resources(cfg.ray.address))
    )
    limits = plan_limits(cfg, device, inputs.spec)
    protocol = protocol_of(cfg.measure, device, inputs.spec, limits.gpus, sweep_workload(cfg))
    probes = 1.0
    if cfg.search.batch or cfg.search.contexts:
        searches, problems = plan_searches(cfg, device, limits, protocol, inputs.by_model)
        planned = searches.first_probes()
        text = "\n".join(search_text(searches))
        text += "\n\nfirst probes: " + plan_text(planned, problems, device, limits)
        probes = search_probes(searches, len(planned))
    else:
        planned, problems = plan_sweep(cfg, device, limits, inputs.by_model)
        text = plan_text(planned, problems, device, limits)
    fed = "\n".join(first_lines(cfg, inputs))
    session = cluster_resources(cfg.ray.address) if device == "cuda" else None
    gpus = session.gpus if session is not None else 0.0
    slots = scheduler_slots(cfg, device, gpus, limits.gpus, session.node_gpus if session is not None else ())
    forecast = forecast_sweep(cfg, device, planned, protocol, slots, gpus, limits.gpus, probes)
    bill = "\n".join([*forecast.bill.lines(), "", *cell_lines(forecast.bill.cells)])
    print(redact_text(f"sweep {cfg.name} (dry run)\n{fed}\n{text}\n\n{bill}"), file=out or sys.stdout)
    forecast.bill.check_budget(cfg.planner.max_gpu_hours)  # over budget: one line, exit 2
    return 0


def cluster_resources(address: str) -> ray_session.RaySession:
    """What `ray_session.connect` would find, without starting a local instance."""
    if address and address != LOCAL_RAY:
        session = ray_session.connect(address)
        ray_session.shutdown(session)
        return session
    return ray_session.RaySession(False, float(len(local_gpu_bytes())), float(os.cpu_count() or 1))
