"""The reference: what a lowered kernel means, to judge a lowering without a GPU.

Owns the reference interpreter of the scheduled program (:mod:`.interp`: one block runner for every op,
with FP8 rounding and the memory errors in :mod:`.interp_memory`, warp roles in :mod:`.interp_roles` and
vector terms in :mod:`.vterms`) and the
protocol checker of mbarriers, TMA and the generic/async proxies (:mod:`.protocol`, its clocks and barrier slots in
:mod:`.order_state`, the TMA hardware model in :mod:`.hwsim`) with the failures it reports (:mod:`.hazards`),
and the tensor cores' model (:mod:`.interp_mma`, :mod:`.mma_groups`).
Imports only :mod:`cbrules.ir`, :mod:`cbrules.schedule` and :mod:`cbrules.errors`.
"""
