"""Code generation (installed as ``cbrules.codegen``): CUDA C++ from a schedule, NVRTC, the launcher.

Consumes only the scheduler's :class:`cbrules.schedule.Step` tree and the IR's tables
(:mod:`cbrules.ir`); imports nothing above the scheduler.
"""
