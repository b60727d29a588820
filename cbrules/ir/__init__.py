"""The IR and its builder: what a kernel is before and while rules rewrite it.

Owns the op table (:mod:`.ops`), index/predicate terms (:mod:`.terms`), the name rules
(:mod:`.names`), the kernel graph (:mod:`.graph`) with its sibling order (:mod:`.order`) and
invariants (:mod:`.verify`; what value an attribute may hold: :mod:`.attributes`), the hardware limits (:mod:`.limits`), the
circular-buffer options declared once in ``rules/options.rules`` (:mod:`.option_schema`), the builder a kernel is written
with (:mod:`.builder`, one class: its argument values and handles in :mod:`.builder_values`, the tensor
cores' fragment model its MMA calls use in :mod:`.builder_mma`; what TMA loads cover in :mod:`.coverage`), the tensor cores' layout facts (:mod:`.mma_layout`) and the binding of host
arrays to kernel parameters (:mod:`.bind`).
Imports nothing of cbrules but the base modules (:mod:`cbrules.errors`, :mod:`cbrules.shipped`,
:mod:`cbrules.sexpr`).
"""
