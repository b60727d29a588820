"""The rule engine: reads rule files and rewrites a kernel graph with them.

Owns the rule language's schema (:mod:`.schema`), rule
values (:mod:`.values`), the rule-file reader (:mod:`.rulefile`) and its static checks of each
rule (:mod:`.rulecheck`), the matcher (:mod:`.match`: node patterns and joins, with value patterns in
:mod:`.value_patterns`, relations in :mod:`.relations` and join plans and indexes in :mod:`.plan`), the
actions (:mod:`.actions`, the clone primitive among them, with the checks on the values they set
in :mod:`.action_values`), the words rules hand each other (:mod:`.vocabulary`), the engine that fires rules phase by phase (:mod:`.engine`, matching the rules
whose matches read one node's subtree again only where the graph changed: :mod:`.anchors`; what it
remembers between applications about its private copy of the graph and about the rules' news:
:mod:`.memory`), the loading of
egglog forms (:mod:`.eggload`), the egglog bridge that simplifies index terms (:mod:`.egg`) and the
lowering's simplification step that uses it (:mod:`.simplifier`).
Reads rule text with the s-expression reader :mod:`cbrules.sexpr`. Imports only :mod:`cbrules.ir` and the base
modules (:mod:`cbrules.errors`, :mod:`cbrules.sexpr`, ...); reading a rule file loads no egglog.
"""
