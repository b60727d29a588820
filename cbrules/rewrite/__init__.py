"""The rule engine: reads rule files and rewrites a kernel graph with them.

Owns the s-expression reader (:mod:`.sexpr`), the rule language's schema (:mod:`.schema`), rule
values (:mod:`.values`), the rule-file reader (:mod:`.rulefile`) and its static checks of each
rule (:mod:`.rulecheck`), the matcher
(:mod:`.match`), the actions (:mod:`.actions`), the engine that fires rules phase by phase
(:mod:`.engine`), the loading of egglog forms (:mod:`.eggload`) and the egglog bridge that
simplifies index terms (:mod:`.egg`).
Imports only :mod:`cbrules.ir` and :mod:`cbrules.errors`; reading a rule file loads no egglog.
"""
