"""Timing at steady clocks: each implementation alone, after sustained load, with an idle gap between them.

Under sustained tensor-core load the H200 sits at its power cap (~700 W, ~1440 MHz); power management
reacts with a lag, so a short burst inherits the clocks left by whatever ran before it, and kernels that
draw different power are not compared fairly by interleaving them. :func:`time_alone` therefore

1. idles ``idle`` seconds (the clocks and power of the previous implementation fade),
2. launches the implementation back to back for ``sustain`` seconds (the clocks settle under its own load),
3. records ``samples`` launches back to back with a CUDA event between each (no host sync between them,
   so the GPU never idles), and returns the median launch time.

:func:`time_each_alone` does this for several implementations in turn; it may be followed by an
interleaved measurement (``interleaved``) that a benchmark reports beside it, labelled as such.
"""
from __future__ import annotations

import shutil
import statistics
import subprocess
import time
from typing import Callable


def gpu_clocks() -> dict:
    """The SM clock (MHz) and board power (W) that nvidia-smi reads now; empty where it is absent."""
    tool = shutil.which("nvidia-smi")
    if not tool:
        return {}
    try:
        out = subprocess.run([tool, "--query-gpu=clocks.sm,power.draw", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=10).stdout.split("\n")[0]
        sm, watts = (float(v) for v in out.split(","))
    except (OSError, ValueError, subprocess.SubprocessError):
        return {}
    return {"sm_mhz": sm, "watts": watts}


def time_alone(launch: Callable[[], None], torch, sustain: float = 2.0, samples: int = 100,
               idle: float = 5.0) -> dict:
    """Median seconds of one launch of ``launch`` at the clocks its own sustained load settles at.

    Returns ``{"seconds", "spread", "sustained_launches", "clocks"}``: the median, the inter-quartile
    range relative to it, how many launches the sustained phase made, and the SM clock / power read
    right after the samples (see :func:`gpu_clocks`)."""
    torch.cuda.synchronize()
    time.sleep(idle)
    launch()
    torch.cuda.synchronize()
    # sustained load: launch in batches until ``sustain`` seconds have passed on the host clock
    t0, count, batch = time.perf_counter(), 0, 1
    while time.perf_counter() - t0 < sustain:
        for _ in range(batch):
            launch()
        torch.cuda.synchronize()
        count += batch
        batch = min(batch * 2, 64)
    events = [torch.cuda.Event(enable_timing=True) for _ in range(samples + 1)]
    events[0].record()
    for i in range(samples):
        launch()
        events[i + 1].record()
    events[-1].synchronize()
    clocks = gpu_clocks()
    secs = sorted(events[i].elapsed_time(events[i + 1]) / 1e3 for i in range(samples))
    median = statistics.median(secs)
    q1, q3 = secs[len(secs) // 4], secs[(3 * len(secs)) // 4]
    return {"seconds": median, "spread": (q3 - q1) / median, "sustained_launches": count, "clocks": clocks}


def time_each_alone(launches: dict, torch, sustain: float = 2.0, samples: int = 100, idle: float = 5.0,
                    report: Callable[[str], None] | None = None) -> dict:
    """:func:`time_alone` for every ``label -> launch`` in turn; returns ``label -> result``."""
    results = {}
    for label, launch in launches.items():
        results[label] = time_alone(launch, torch, sustain, samples, idle)
        if report:
            r = results[label]
            report(f"{label}: {r['seconds'] * 1e3:.3f} ms median of {samples} (IQR {r['spread']:.1%}), "
                   f"{r['clocks'].get('sm_mhz', '?')} MHz {r['clocks'].get('watts', '?')} W")
    return results


def interleaved(launches: dict, torch, rounds: int = 9, per_round: int = 5, warmup: int = 3) -> dict:
    """Median seconds a launch when every implementation runs ``per_round`` launches in turn, ``rounds``
    times (CUDA events). Bursts inherit the clocks of the kernel before them: report it only beside
    :func:`time_each_alone`'s figure, labelled as interleaved."""
    for fn in launches.values():
        for _ in range(warmup):
            fn()
    torch.cuda.synchronize()
    times: dict = {k: [] for k in launches}
    for _ in range(rounds):
        for label, fn in launches.items():
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record()
            for _ in range(per_round):
                fn()
            e.record()
            e.synchronize()
            times[label].append(s.elapsed_time(e) / 1e3 / per_round)
    return {k: statistics.median(v) for k, v in times.items()}
