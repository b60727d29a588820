"""The circular-buffer test matrix: every seed kernel x stages x prefetch x WAR mode."""
from cbrules.kernels import KERNELS, SEED_MATRIX

STAGES = (2, 3, 4)
WARS = ("sync", "mbarrier")
CASES = [(name, s, p, w) for name in SEED_MATRIX for s in STAGES for p in range(s) for w in WARS]


def case_id(case) -> str:
    name, s, p, w = case
    return f"{name}-S{s}-P{p}-{w}"


def spec(name):
    return KERNELS[name]
