"""Rule authoring: defaults live in the rules, and the checker reports every mistake of a file."""
import pytest

from cbrules import api, options
from cbrules.ir.builder import circular_buffer
from cbrules.cli import main
from cbrules.kernels import get
from cbrules.rewrite.rulefile import RuleErrors, load, rule_dirs
from cbrules.sexpr import RuleError
from rulekit import write_rules
import numpy as np

from cbrules.check import Checker
from cbrules.reference import interp

MBARRIER_DEFAULT = """
    (phase my-defaults :before cb-check)
    (graph-rule my-war-mbarrier
      :doc "loops that do not choose a WAR protection get empty barriers"
      :phase my-defaults
      :match ((for ?L :annotations (:circular_buffer (:war (absent)))))
      :rewrite ((set-option ?L "circular_buffer" :war "mbarrier")))
"""


def test_the_builder_records_only_the_options_given():
    assert circular_buffer(3) == {"stages": 3}
    assert circular_buffer(3, war="sync") == {"stages": 3, "war": "sync"}
    kg = get("single_dim").build(stages=2).graph
    assert options.requested(kg) == {"stages"}


def test_the_rules_fill_in_the_defaults():
    kg = api.lower(get("single_dim").build(stages=4))
    assert options.effective(kg) == [("i", {"stages": 4, "prefetch": 3, "war": "sync"})]


def test_a_user_folder_changes_a_default_and_an_explicit_option_still_wins(tmp_path):
    write_rules(tmp_path / "mine", MBARRIER_DEFAULT)
    rules = [tmp_path / "mine"]
    by_default = api.lower(get("single_dim").build(stages=3), rules=rules)
    assert options.effective(by_default)[0][1]["war"] == "mbarrier"
    assert any(by_default.op(n) == "mbarrier_arrive" for n in by_default.nodes())
    explicit = api.lower(get("single_dim").build(stages=3, war="sync"), rules=rules)
    assert options.effective(explicit)[0][1]["war"] == "sync"
    assert not any(explicit.op(n) == "mbarrier_arrive" for n in explicit.nodes())


def test_set_option_sets_keys_of_one_annotation_and_keeps_the_rest(tmp_path):
    write_rules(tmp_path / "opt", """
        (phase mine :before cb-check)
        (graph-rule opt-two-keys
          :doc "prefetch and war of every circular-buffered loop, and a note in an annotation of its own"
          :phase mine
          :match ((for ?L :annotations (:circular_buffer (:stages ?S :war (absent)))))
          :rewrite ((set-option ?L "circular_buffer" :war "mbarrier" :prefetch (- ?S 2))
                    (set-option ?L "note" :by "opt-two-keys")))
    """)
    kg = api.lower(get("single_dim").build(stages=4), rules=[tmp_path / "opt"])
    loop = next(n for n in kg.nodes("for") if (kg[n].get("annotations") or {}).get("note"))
    ann = kg[loop]["annotations"]
    assert ann["note"] == {"by": "opt-two-keys"}  # made where absent
    assert list(ann["circular_buffer"])[:3] == ["stages", "war", "prefetch"]  # given first, then in order
    assert ann["circular_buffer"]["prefetch"] == 2 and options.effective(kg)[0][1]["war"] == "mbarrier"


@pytest.mark.parametrize("target,annotation,message", [
    ("?K", '"circular_buffer"', "test.rules:6:25: set-option ?K: ?K is bound to a kernel node; options are "
                                "a loop's (for) annotations"),  # when the file loads: ?K's op is known
    ("?s", '"circular_buffer"', "is not a loop; options are a for node's annotations"),  # at lowering
    ("?L", "3", "the annotation is named by a string, got 3"),  # at lowering
    ("?L", '"circular_buffer" :x 1 :y', "test.rules:6:51: keyword :y has no value"),  # when the file loads
], ids=["bound-to-the-kernel", "not-a-loop", "name-not-a-string", "odd-keys"])
def test_set_option_refuses_by_name(tmp_path, target, annotation, message):
    write_rules(tmp_path / "bad", f"""
        (phase mine :before cb-check)
        (graph-rule bad-option
          :doc "a set-option a rule should not make"
          :phase mine
          :match ((kernel ?K) (for ?L :annotations (:circular_buffer (:stages ?S :war (absent)))) (nearest ?s (_) :around ?K))
          :rewrite ((set-option {target} {annotation})))
    """)
    from cbrules.rewrite.engine import LoweringError
    with pytest.raises((RuleError, LoweringError)) as e:
        api.lower(get("single_dim").build(stages=3), rules=[tmp_path / "bad"])
    assert message in str(e.value)
    if isinstance(e.value, LoweringError):  # the rule and its place, and nothing half-rewritten
        assert "rule bad-option" in str(e.value) and "the kernel as built is unchanged" in str(e.value)


def test_lower_and_check_print_the_effective_options(tmp_path, capsys):
    write_rules(tmp_path / "mine", MBARRIER_DEFAULT)
    assert main(["lower", "single_dim", "--stages", "2", "--rules", str(tmp_path / "mine")]) == 0
    first = capsys.readouterr().out.splitlines()[0]
    assert first == "effective options: loop i: stages=2 prefetch=1 (rule default) war=mbarrier (rule default)"
    assert main(["lower", "single_dim", "--stages", "2", "--war", "sync", "--rules", str(tmp_path / "mine")]) == 0
    assert "war=sync\n" in capsys.readouterr().out
    assert main(["check", "single_dim", "--stages", "2", "--sample", "--rules", str(tmp_path / "mine")]) == 0
    out = capsys.readouterr().out
    assert "single_dim: options given: --stages 2;" in out and "war=mbarrier (rule default)" in out


SILENT_MISTAKES = """
    (phase extra :after cb-pipeline)
    (graph-rule parity-typo
      :phase extra
      :match ((mbarrier_wait ?c))
      :rewrite ((set ?c :parrity 1)))
    (graph-rule unbound-message
      :phase extra
      :match ((for ?L))
      :rewrite ((fail "loop {?bb} is bad")))
    (graph-rule unknown-call
      :phase extra
      :match ((for ?L :kind "serial"))
      :rewrite ((insert-at-entry ?L (syncthreads :tag (call "__nanosleep" 32)))))
    (graph-rule any-op-typo
      :phase extra
      :match ((_ ?n :stage "war"))
      :rewrite ((set ?n :stagee "x")))
"""


def test_every_silent_mistake_is_reported_at_once_with_its_position(tmp_path):
    path = write_rules(tmp_path / "bad", SILENT_MISTAKES)
    with pytest.raises(RuleErrors) as e:
        load(rule_dirs([tmp_path / "bad"]))
    lines = str(e.value).splitlines()
    assert [x.split(": ")[0] for x in lines] == [f"{path}:5:21", f"{path}:9:19", f"{path}:13:57", f"{path}:17:21"]
    assert "op 'mbarrier_wait' has no attribute :parrity (did you mean 'parity'?); its attributes: " \
           ":backoff, :backoff_max, :barrier, :parity, :part, :slot, :spin, :stage, :suspend_hint, :tag, :timeout" \
           in lines[0]
    assert "{?bb}, but ?bb is not bound" in lines[1]
    assert "'__nanosleep' is not a device function" in lines[2]
    assert "op '_' has no attribute :stagee (did you mean 'stage'?)" in lines[3]


def test_one_mistake_is_not_reported_again_as_unbound_variables(tmp_path):
    path = write_rules(tmp_path / "bad", """
        (phase extra :after cb-pipeline)
        (graph-rule r :phase extra :match ((fro ?L)) :rewrite ((erase ?L) (set ?L :tag "x")))
    """)
    with pytest.raises(RuleError) as e:
        load(rule_dirs([tmp_path / "bad"]))
    assert not isinstance(e.value, RuleErrors)
    assert str(e.value).startswith(f"{path}:2:36: unknown op 'fro' (did you mean 'for'?)")


def test_names_phases_and_disables_are_all_reported(tmp_path):
    path = write_rules(tmp_path / "bad", """
        (disable cb-prologe)
        (graph-rule a :phase cb-stag :match ((for ?L)) :rewrite ((erase ?L)))
        (graph-rule a :phase cb-stage :after (cb-mian) :match ((for ?L)) :rewrite ((erase ?L)))
    """)
    with pytest.raises(RuleErrors) as e:
        load(rule_dirs([tmp_path / "bad"]))
    text = str(e.value)
    for needle in (f"{path}:3:1: duplicate rule name 'a'", f"{path}:2:1: rule a: unknown phase 'cb-stag' "
                   "(did you mean 'cb-stage'?)", "unknown rule cb-mian (did you mean 'cb-main'?)",
                   f"{path}:1:10: disable: unknown rule 'cb-prologe' (did you mean 'cb-prologue'?)"):
        assert needle in text


def test_rules_check_dir_includes_the_shipped_rules_and_says_so(tmp_path, capsys):
    write_rules(tmp_path / "mine", MBARRIER_DEFAULT)  # refers to the shipped phase cb-normalize
    assert main(["rules", "check", str(tmp_path / "mine")]) == 0
    out = capsys.readouterr().out
    assert "checked: the shipped rules (" in out and f"together with {tmp_path / 'mine'}" in out
    assert "my-defaults" in out
    assert main(["rules", "check", "rules"]) == 0  # the shipped folder named again is read once
    write_rules(tmp_path / "bad", SILENT_MISTAKES)
    assert main(["rules", "check", str(tmp_path / "bad")]) == 1
    err = capsys.readouterr().err
    assert err.startswith("cbrules: RuleErrors: ") and len(err.splitlines()) == 4


def test_setting_what_a_node_is_is_a_check_error(tmp_path):
    path = write_rules(tmp_path / "bad", """
        (phase extra :after cb-pipeline)
        (graph-rule r :phase extra :match ((syncthreads ?s)) :rewrite ((set ?s :op "for")))
    """)
    with pytest.raises(RuleError) as e:
        load(rule_dirs([tmp_path / "bad"]))
    assert str(e.value).startswith(f"{path}:2:72: a rule cannot set :op") and "(replace ?n TEMPLATE)" in str(e.value)


def test_clone_set_keys_are_the_cloned_scopes_attributes(tmp_path):
    path = write_rules(tmp_path / "bad", """
        (phase extra :after cb-pipeline)
        (graph-rule r :phase extra :match ((for ?L :part "main")) :rewrite ((clone ?L :set (:prat "x"))))
    """)
    with pytest.raises(RuleError) as e:
        load(rule_dirs([tmp_path / "bad"]))
    assert str(e.value).startswith(f"{path}:2:85: op 'for' has no attribute :prat (did you mean 'part'?)")


# ---------------------------------------------------------------- issue 32: how code is emitted
CACHE_HINTS = """
    (phase my-hints :after cb-pipeline)
    (graph-rule stream-evict-first
      :doc "streamed input tiles are read once: evict them first, and promote the map's fetches to 256 bytes"
      :phase my-hints
      :match ((tma_load ?ld :cache_hint (absent)))
      :rewrite ((set ?ld :cache_hint "evict_first" :l2_promotion "256B")))
    (graph-rule stores-evict-last
      :doc "the output is read next: keep it in L2"
      :phase my-hints
      :match ((tma_store ?st :cache_hint (absent)))
      :rewrite ((set ?st :cache_hint "evict_last")))
"""
EXP_BACKOFF = """
    (phase my-waits :after cb-pipeline)
    (graph-rule consumer-exponential-backoff
      :doc "consumers spin 4 polls, then sleep from 32 ns doubling to 1024, hint try_wait, trap after 1 s"
      :phase my-waits
      :match ((mbarrier_wait ?w :stage "consumer" :backoff (absent)))
      :rewrite ((set ?w :backoff 32 :backoff_max 1024 :spin 4 :suspend_hint 2000 :timeout 1000000000)))
"""
TERM_BACKOFF = """
    (phase my-waits :after cb-pipeline)
    (graph-rule later-waits-sleep-longer
      :phase my-waits
      :match ((mbarrier_wait ?w :stage "consumer" :backoff (absent)) (for ?L :var ?i) (inside ?w ?L))
      :rewrite ((set ?w :backoff (* 32 (% (var ?i) 4)))))
"""


def _compiles(src) -> None:
    from cbrules.codegen.nvrtc import compile_cuda
    assert compile_cuda(src.text, src.name).cubin.startswith(b"\x7fELF")


def test_a_cache_hint_rule_reaches_the_cuda_the_tensor_map_and_nvrtc(tmp_path):
    write_rules(tmp_path / "hints", CACHE_HINTS)
    rules = [tmp_path / "hints"]
    src = api.generate(get("single_dim").build(stages=3, tma_store=True), rules=rules)
    loads = [x for x in src.text.splitlines() if x.lstrip().startswith("cb_tma_load")]
    assert loads and all(x.lstrip().startswith("cb_tma_load_hint(") and "cb_l2_evict_first()" in x for x in loads)
    assert "createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" in src.text
    assert "mbarrier::complete_tx::bytes.L2::cache_hint [%0], [%1, {%4}], [%2], %3;" in src.text
    assert "cb_tma_store_async_hint(&out_tmap" in src.text and "bulk_group.L2::cache_hint" in src.text
    assert src.l2_promotion == (("x_tmap", "256B"),)
    _compiles(src)
    plain = api.generate(get("single_dim").build(stages=3, tma_store=True))
    assert "cache_hint" not in plain.text and plain.l2_promotion == ()
    # the interpreter runs the hinted kernel (a hint changes where data stays in L2, never its value)
    assert Checker(blocks="sample", rules=rules).check(get("single_dim"), 3, 2).status == "ok"


def test_an_exponential_backoff_rule_with_spin_hint_and_timeout(tmp_path):
    write_rules(tmp_path / "waits", EXP_BACKOFF)
    src = api.generate(get("single_dim").build(stages=3), rules=[tmp_path / "waits"])
    waits_ = [x.strip() for x in src.text.splitlines() if x.strip().startswith("cb_mbar_wait")]
    assert len(waits_) == 2 and all(x.startswith("cb_mbar_wait_mode(") and
                                    ", 32u, 1024u, 4u, 2000u, 1000000000ull, " in x for x in waits_)
    assert "mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2, %3;" in src.text  # the suspend-time hint
    assert "timed out after %llu ns" in src.text and "__trap();" in src.text
    _compiles(src)
    assert Checker(blocks="sample", rules=[tmp_path / "waits"]).check(get("single_dim"), 2, 2).status == "ok"


def test_a_backoff_term_is_computed_per_iteration_and_checked_by_the_interpreter(tmp_path):
    write_rules(tmp_path / "term", TERM_BACKOFF)
    src = api.generate(get("single_dim").build(stages=3), rules=[tmp_path / "term"]).text
    assert "cb_mbar_wait_mode(cb_smem_addr(&cb_full_2[i % 3]), i / 3, (unsigned)(32 * (i % 4)), 0u, 0u, 0u, 0ull" \
        in src
    assert Checker(blocks="sample", rules=[tmp_path / "term"]).check(get("single_dim"), 2, 2).status == "ok"
    write_rules(tmp_path / "negative", TERM_BACKOFF.replace("(* 32 (% (var ?i) 4))", "(- 3 (var ?i))"))
    kg = api.lower(get("single_dim").build(stages=3), rules=[tmp_path / "negative"])
    n = 256 * 8
    with pytest.raises(interp.InterpError, match=r"mbarrier_wait :backoff 3 - i is -1 on a thread"):
        interp.run(kg, {"x": np.zeros(n, np.float32), "out": np.zeros(n, np.float32)}, blocks=[0])


def test_a_backoff_of_zero_is_the_plain_wait(tmp_path):
    write_rules(tmp_path / "zero", EXP_BACKOFF.replace(":backoff 32 :backoff_max 1024 :spin 4 :suspend_hint 2000 "
                                                       ":timeout 1000000000", ":backoff 0"))
    src = api.generate(get("single_dim").build(stages=3), rules=[tmp_path / "zero"]).text
    assert src == api.generate(get("single_dim").build(stages=3)).text  # no __nanosleep(0) loop


def test_copies_through_one_map_must_agree_on_its_l2_promotion():
    from types import SimpleNamespace as Step
    from cbrules.codegen import hints
    from cbrules.codegen.errors import CodegenError
    a = Step(op="tma_load", node=4, attrs={"tmap": "x_tmap", "l2_promotion": "64B"})
    b = Step(op="tma_load", node=9, attrs={"tmap": "x_tmap", "l2_promotion": "256B"})
    assert hints.l2_promotions([a, a]) == (("x_tmap", "64B"),)
    with pytest.raises(CodegenError, match=r"node #4 asks for l2_promotion '64B' and node #9 for '256B'"):
        hints.l2_promotions([a, b])


def test_every_hinted_copy_helper_compiles():
    """The helpers of every copy kind and rank 1..5, and every policy, through NVRTC in one kernel."""
    from cbrules.codegen import hints
    from cbrules.codegen.cuda import PRELUDE
    from cbrules.codegen.nvrtc import compile_cuda
    from cbrules.ir.ops import CACHE_HINTS as WORDS
    kinds = {(k, r) for k in ("load", "store", "store_async") for r in range(1, 6)}
    helpers = hints._policy_helpers(set(WORDS)) + hints._copy_helpers(kinds)
    calls = []
    for r in range(1, 6):
        cs = ", ".join(str(i) for i in range(r))
        calls += [f"cb_tma_load_hint(0, &m, 8, cb_l2_evict_last(), {cs});",
                  f"cb_tma_store_hint(&m, 0, cb_l2_evict_normal(), {cs});",
                  f"cb_tma_store_async_hint(&m, 0, cb_l2_evict_first(), {cs});"]
    text = "\n".join([PRELUDE, *helpers, hints.WAIT_MODE, 'extern "C" __global__ void k(const __grid_constant__ '
                      "CUtensorMap m) {", *calls, "cb_mbar_wait_mode(8, 0, 0u, 64u, 2u, 100u, 5000ull, 3);", "}"])
    assert compile_cuda(text, "k").cubin.startswith(b"\x7fELF")


# ---------------------------------------------------------------- issue 32: rules check is strict about values
def test_rules_check_refuses_wrong_literals_at_their_position(tmp_path, capsys):
    path = write_rules(tmp_path / "bad", """
        (phase extra :after cb-pipeline)
        (graph-rule a :phase extra :match ((mbarrier_wait ?w)) :rewrite ((set ?w :backoff "32")))
        (graph-rule b :phase extra :match ((mbarrier_wait ?w)) :rewrite ((set ?w :backoff 2000000)))
        (graph-rule c :phase extra :match ((mbarrier_wait ?w)) :rewrite ((set ?w :backoff -1)))
        (graph-rule d :phase extra :match ((tma_load ?t)) :rewrite ((set ?t :cache_hint "evict_frist")))
        (graph-rule e :phase extra :match ((for ?L)) :rewrite ((clone ?L :set (:step 1))
          (insert-at-entry ?L (mbarrier_wait :barrier "x" :slot 0 :parity 0 :timeout 0))))
    """)
    assert main(["rules", "check", str(tmp_path / "bad")]) == 1
    err = capsys.readouterr().err.splitlines()
    assert [x.removeprefix("cbrules: RuleErrors: ").split(": ")[0] for x in err] == \
        [f"{path}:{n}" for n in ("2:83", "3:83", "4:83", "5:81", "7:78")]
    assert 'mbarrier_wait :backoff takes an int in 0..1000000 or a term, not the text "32"; write 32 without ' \
           "quotes" in err[0]
    assert "2000000 is above 1000000" in err[1] and "-1 is below 0" in err[2]
    assert 'not "evict_frist" (did you mean \'evict_first\'?)' in err[3]
    assert "mbarrier_wait :timeout takes an int in 1..1099511627776: 0 is below 1" in err[4]


def test_rules_check_warns_of_patterns_that_may_bind_one_node(tmp_path, capsys):
    path = write_rules(tmp_path / "mine", """
        (phase tidy :after cb-pipeline)
        (graph-rule maybe-one
          :phase tidy
          :match ((mbarrier_wait ?first :barrier ?bar) (mbarrier_wait ?again :barrier ?bar))
          :rewrite ((erase ?again)))
        (graph-rule two :phase tidy
          :match ((mbarrier_wait ?a :barrier ?b) (mbarrier_wait ?c :barrier ?b) (before ?a ?c))
          :rewrite ((erase ?c)))
        (graph-rule pinned-apart :phase tidy
          :match ((for ?L :part "main") (for ?M :part "epilogue"))
          :rewrite ((erase ?M)))
    """)
    assert main(["rules", "check", str(tmp_path / "mine")]) == 0
    warned = [x for x in capsys.readouterr().out.splitlines() if ": warning: " in x]
    assert warned == [f"{path}:4:48: warning: rule maybe-one: ?first and ?again may bind the same mbarrier_wait "
                      "node (nothing in :match says they differ); add (distinct ?first ?again) or an order relation "
                      "such as (before ?first ?again) if they must be two nodes"]


PREFETCH_POLICY = """
    (phase my-prefetch :before cb-check)
    (graph-rule prefetch-s-minus-2
      :doc "from four stages on, prefetch S - 2 tiles"
      :phase my-prefetch
      :match ((for ?L :annotations ?ann) (for ?L :annotations (:circular_buffer (:stages ?S :prefetch (absent)))))
      :where ((>= ?S 4))
      :rewrite ((set ?L :annotations (assoc ?ann "circular_buffer"
                                       (assoc (get ?ann "circular_buffer") "prefetch" (- ?S 2))))))
"""


def test_a_policy_phase_after_the_validations_is_warned_of_and_before_them_is_validated(tmp_path, capsys):
    from cbrules.rewrite.engine import LoweringError
    late = write_rules(tmp_path / "late", PREFETCH_POLICY.replace(":before cb-check", ":before cb-normalize"))
    assert main(["rules", "check", str(tmp_path / "late")]) == 0
    out = capsys.readouterr().out
    assert f"{late}:7:13: warning: rule prefetch-s-minus-2 (phase my-prefetch) sets :annotations of a for after " \
           "phase cb-check validated it" in out and "so the engine runs those checks again after phase " \
           "my-prefetch; declare the phase (phase my-prefetch :before cb-check)" in out
    # placed after cb-check, the policy is checked again after its phase: refused by name, not compiled
    with pytest.raises(LoweringError) as e:
        api.lower(get("single_dim").build(stages=4, warp_specialize=True), rules=[tmp_path / "late"])
    assert "prefetch=2 does not apply to a warp-specialized loop" in str(e.value) and e.value.rule == \
        "cb-ws-reject-prefetch" and str(e.value).endswith(
            "(checked again after phase my-prefetch, whose rule prefetch-s-minus-2 set what phase cb-check had "
            "validated; declare the phase before it: (phase my-prefetch :before cb-check))")
    # a value the checks accept is applied as before
    late_kg = api.lower(get("single_dim").build(stages=4), rules=[tmp_path / "late"])
    assert options.effective(late_kg)[0][1]["prefetch"] == 2
    # placed where the warning says, the policy applies and the shipped check refuses what it must
    write_rules(tmp_path / "early", PREFETCH_POLICY)
    assert main(["rules", "check", str(tmp_path / "early")]) == 0
    assert ": warning: " not in capsys.readouterr().out
    kg = api.lower(get("single_dim").build(stages=4), rules=[tmp_path / "early"])
    assert options.effective(kg)[0][1]["prefetch"] == 2
    with pytest.raises(LoweringError, match="prefetch=2 does not apply to a warp-specialized loop"):
        api.lower(get("single_dim").build(stages=4, warp_specialize=True), rules=[tmp_path / "early"])


# ---------------------------------------------------------------- issue 32: why-not explains
def test_why_not_says_a_rule_is_disabled_and_by_which_file(tmp_path, capsys):
    path = write_rules(tmp_path / "off", "(disable cb-epilogue)\n")
    assert main(["trace", "single_dim", "why-not", "--rule", "cb-epilogue", "--rules", str(tmp_path / "off")]) == 0
    out = capsys.readouterr().out
    assert f"rule cb-epilogue is disabled by (disable cb-epilogue) at {path}:1:10, so it is never tried" in out
    assert "Were it enabled: rule cb-epilogue matches #2 for(var=i)" in out and "yet it never fired" not in out
    # with --node and no --step: the last graph of the rule's phase that holds the node (#2 is erased later)
    assert main(["trace", "single_dim", "why-not", "--rule", "cb-epilogue", "--node", "2", "--rules",
                 str(tmp_path / "off")]) == 0
    out = capsys.readouterr().out
    assert "is disabled by" in out and "does match #2 for(var=i)" in out and "in its phase cb-pipeline" in out


PEEPHOLE = """
    (phase tidy :after cb-pipeline)
    (graph-rule drop-repeated-wait
      :phase tidy
      :match ((mbarrier_wait ?first :barrier ?bar :slot ?s :parity ?p)
              (next ?first ?again)
              (mbarrier_wait ?again :barrier ?bar :slot ?s :parity ?p))
      :rewrite ((erase ?again)))
    (graph-rule drop-ordered-wait
      :phase tidy
      :match ((mbarrier_wait ?w) (tma_load ?ld) (ordered ?w ?ld))
      :rewrite ((erase ?w)))
"""


def test_why_not_without_a_node_names_the_closest_candidate_and_a_relations_facts(tmp_path, capsys):
    path = write_rules(tmp_path / "tidy", PEEPHOLE)
    args = ["trace", "single_dim", "why-not", "--rules", str(tmp_path / "tidy"), "--rule"]
    assert main([*args, "drop-repeated-wait"]) == 0
    out = capsys.readouterr().out.splitlines()[-1]
    assert out.startswith("rule drop-repeated-wait never fired (tried on the graphs its phase tidy saw: after steps ")
    assert f"it fails pattern element (mbarrier_wait ?again :barrier ?bar :slot ?s :parity ?p) at {path}:6:11" in out
    assert "is a load node, the pattern wants a mbarrier_wait" in out
    assert main([*args, "drop-ordered-wait"]) == 0
    out = capsys.readouterr().out.splitlines()[-1]
    assert f"(ordered ?w ?ld) at {path}:10:45 -- relation does not hold with ?w=#" in out
    assert "they are not children of one scope" in out and "depends path ?w -> ?ld: no, ?ld -> ?w: no" in out


def test_dot_labels_its_edges_and_lower_debug_shows_node_ids(capsys):
    assert main(["trace", "single_dim", "dot", "--step", "3"]) == 0
    dot = capsys.readouterr().out
    assert 'label="depends", fontsize=8]' in dot and "legend [shape=note" in dot
    assert main(["lower", "single_dim", "--debug"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[1].startswith("#0 kernel name=single_dim") and lines[2].lstrip().startswith("#")


# ---------------------------------------------------------------- issue 32: checker reports point at the cause
def test_a_missing_consumer_is_named_with_its_tile_the_unwritten_elements_and_the_disable(tmp_path):
    path = write_rules(tmp_path / "off", "(disable cb-epilogue)\n")
    res = Checker(rules=[tmp_path / "off"]).check(get("single_dim"), 3, 3)
    assert res.status == "FAIL" and res.detail.startswith("OutstandingTma: ")
    assert "the TMA load #" in res.detail and "into tile[256:512], issued in block (0, 0, 0), iteration i=1 " \
        "(prologue), is still in flight (nobody waited for it: no reader consumed that tile)" in res.detail
    # the main loop wrote the first tile; the epilogue's two never were
    assert "vs numpy when it stopped: out differs at 612 of 868 elements (612 never written): flat elements " \
           "256..867" in res.detail and res.err_numpy == float("inf")
    assert f"disabled by the rule folders: cb-epilogue ({path}:1:10)" in res.detail


def test_a_hazard_names_the_users_rule_that_erased_the_wait(tmp_path):
    path = write_rules(tmp_path / "unsound", """
        (phase tidy :after cb-pipeline)
        (graph-rule drop-any-wait
          :phase tidy
          :match ((mbarrier_wait ?first :barrier ?bar :slot ?s :parity ?p)
                  (mbarrier_wait ?again :barrier ?bar :slot ?s :parity ?p))
          :rewrite ((erase ?again)))
    """)
    res = Checker(blocks="sample", rules=[tmp_path / "unsound"]).check(get("pointwise"), 1, 3)
    assert res.status == "FAIL" and res.detail.startswith("RawHazard: ")
    assert f"erased by a rule of yours (a likely cause): rule drop-any-wait @ {path}:2 erased #" in res.detail
    assert "mbarrier_wait(barrier=cb_full_3) at step " in res.detail


def test_a_hazard_names_the_users_rule_that_moved_the_wait_after_the_read(tmp_path):
    path = write_rules(tmp_path / "late", """
        (phase late :after cb-pipeline)
        (graph-rule wait-after-read
          :phase late
          :match ((for ?L :part "main")
                  (mbarrier_wait ?w :stage "consumer" :child-of ?L)
                  (for ?r :child-of ?L)
                  (next ?w ?r)
                  (syncthreads ?s :stage "war" :child-of ?L))
          :rewrite ((remove-edge ?w ?r) (add-edge ?r ?w) (move ?w :before ?s)))
    """)
    res = Checker(blocks="sample", rules=[tmp_path / "late"]).check(get("pointwise"), 4, 3)
    assert res.status == "FAIL" and res.detail.startswith("RawHazard: ")
    assert f"moved by a rule of yours (a likely cause): rule wait-after-read @ {path}:2 moved #" in res.detail
    assert "mbarrier_wait(barrier=cb_full_3) (now in #" in res.detail and "erased by" not in res.detail


# ---------------------------------------------------------------- issue 32: the other authoring tasks
def test_a_repeated_wait_peephole_from_a_rule_file_checks_clean_and_runs(tmp_path, capsys):
    from test_rule_language import PEEPHOLE as REPEATED
    write_rules(tmp_path / "peephole", REPEATED)
    assert main(["rules", "check", str(tmp_path / "peephole")]) == 0
    assert ": warning: " not in capsys.readouterr().out  # (next ?first ?again) keeps the two waits apart
    tidy = api.lower(get("pointwise").build(stages=3), rules=[tmp_path / "peephole"])
    assert sum(tidy.op(n) == "mbarrier_wait" for n in tidy.nodes()) == 2
    assert Checker(blocks="sample", rules=[tmp_path / "peephole"]).check(get("pointwise"), 3, 3).status == "ok"


def test_the_step_viewer_shows_a_users_rule_with_its_place_and_values(tmp_path):
    from cbrules import viewer
    path = write_rules(tmp_path / "waits", EXP_BACKOFF)
    kg = api.lower(get("single_dim").build(stages=3), rules=[tmp_path / "waits"], debug=True)
    page = viewer.page(kg.trace, "", "t")
    import json
    data = json.loads(page.split('type="application/json">', 1)[1].split("</script>")[0])
    mine = [s for s in data["steps"] if s["rule"] == "consumer-exponential-backoff"]
    assert len(mine) == 2 and all(s["at"].endswith(f"{path.name}:2") for s in mine)
    assert ["backoff", "(absent)", "32"] == mine[0]["changes"][0][1:] and \
        {c[1] for c in mine[0]["changes"]} == {"backoff", "backoff_max", "spin", "suspend_hint", "timeout"}


def test_a_pattern_literal_no_value_can_equal_is_refused_at_its_position(tmp_path):
    path = write_rules(tmp_path / "bad", """
        (phase p :after cb-pipeline)
        (graph-rule r :phase p :match ((tma_load ?ld :cache_hint "evict_frist")) :rewrite ((erase ?ld)))
    """)
    with pytest.raises(RuleError) as e:
        load(rule_dirs([tmp_path / "bad"]))
    assert str(e.value).startswith(f'{path}:2:58: tma_load :cache_hint takes one of "evict_first", "evict_last", '
                                   '"normal", not "evict_frist" (did you mean \'evict_first\'?)')


def test_rules_check_refuses_bad_literals_inside_one_of_and_bad_literal_names(tmp_path, capsys):
    path = write_rules(tmp_path / "bad", """
        (phase p :after cb-pipeline)
        (graph-rule a :phase p :match ((mbarrier_wait ?w :backoff (one-of 32 2000000))) :rewrite ((erase ?w)))
        (graph-rule b :phase p :match ((tma_load ?t :cache_hint (one-of "normal" "evict_fist"))) :rewrite ((erase ?t)))
        (graph-rule c :phase p :match ((load ?l)) :rewrite ((set ?l :dst "int")))
        (graph-rule d :phase p :match ((for ?L)) :rewrite ((insert-at-entry ?L
          (alloc :buf "my tile" :space "shared" :dtype "float32" :shape (4)))))
        (graph-rule e :phase p :match ((load ?l :src (not "__x"))) :rewrite ((erase ?l)))
        (graph-rule ok :phase p :match ((load ?l :src (one-of "x_tile" "y_tile") :dst "v0"))
          :rewrite ((set ?l :dst "v0_again")))
    """)
    assert main(["rules", "check", str(tmp_path / "bad")]) == 1
    err = capsys.readouterr().err.splitlines()
    assert [x.removeprefix("cbrules: RuleErrors: ").split(": ")[0] for x in err] == \
        [f"{path}:{n}" for n in ("2:70", "3:74", "4:66", "6:15", "7:51")]
    assert "mbarrier_wait :backoff takes an int in 0..1000000 or a term: 2000000 is above 1000000" in err[0]
    assert 'not "evict_fist" (did you mean \'evict_first\'?)' in err[1]
    assert "load :dst is a name the CUDA uses: 'int' is a C/C++/CUDA keyword or reserved word; rename it, " \
           "e.g. 'int_'" in err[2]
    assert "alloc :buf is a name the CUDA uses: 'my tile' is not a C identifier" in err[3] and "'my_tile'" in err[3]
    assert "load :src is a name the CUDA uses: '__x' is reserved by C++" in err[4]


def test_the_cache_hint_benchmarks_rule_folders_set_what_they_say():
    """benchmarks/cache_hints.py measures these folders on the GPU; here: each sets its hint (no compile)."""
    from pathlib import Path
    from cbrules.codegen.cuda import emit
    from cbrules.kernels.matmul_tc import matmul_tc
    from cbrules.schedule import schedule
    folder = Path(__file__).resolve().parents[1] / "benchmarks" / "cache_hint_rules"
    for name, want in (("evict-first", "cb_l2_evict_first()"), ("evict-first-promote-256", "cb_l2_evict_first()")):
        src = emit(schedule(api.lower(get("pointwise").build(stages=4), rules=[folder / name])))
        assert src.text.count(want) >= 2 and ("256B" in dict(src.l2_promotion).get("x_tmap", "")) == ("256" in name)
    src = emit(schedule(api.lower(get("pointwise").build(stages=4), rules=[folder / "promote-256"])))
    assert src.l2_promotion == (("x_tmap", "256B"), ("y_tmap", "256B")) and "cache_hint" not in src.text
    mm = emit(schedule(api.lower(matmul_tc(stages=4, warp_specialize=True, registers=(40, 232)),
                                 rules=[folder / "mm-a-first-b-last"]))).text
    loads = [x for x in mm.splitlines() if x.lstrip().startswith("cb_tma_load_hint(")]
    assert {("&b_tmap" in x, "evict_last" in x) for x in loads} == {(True, True), (False, False)}


TYPO_TAG = """
    (phase mine :after cb-stage)
    (graph-rule drop-a-commit
      :doc "a handle spelled wrong: it names no word any rule writes"
      :phase mine
      :match ((wgmma_commit ?c :tag "cb-mma-wated"))
      :rewrite ((erase ?c)))
"""


def test_a_handle_no_rule_writes_is_an_error_at_its_position(tmp_path, capsys):
    path = write_rules(tmp_path / "typo", TYPO_TAG)
    with pytest.raises(RuleError) as e:
        load(rule_dirs([tmp_path / "typo"]))
    assert str(e.value).startswith(f"{path}:5:33: rule drop-a-commit: no rule writes :tag \"cb-mma-wated\"")
    assert "did you mean 'cb-mma-waited'?" in str(e.value)
    assert main(["rules", "check", str(tmp_path / "typo")]) == 1
    assert "no rule writes :tag \"cb-mma-wated\"" in capsys.readouterr().err


@pytest.mark.parametrize("pattern,word", [
    ('(for ?L :part (not "consumr"))', "consumr"),  # under not: always true
    ('(if ?p :tag (one-of "cb-store" "cb-stor"))', "cb-stor"),
    ('(for ?L :stage "producr")', "producr"),
], ids=["not", "one-of", "stage"])
def test_each_literal_of_a_handle_pattern_is_checked(tmp_path, pattern, word):
    write_rules(tmp_path / "w", f"""
        (phase mine :after cb-stage)
        (graph-rule w
          :doc "reads a handle"
          :phase mine
          :match ({pattern})
          :rewrite ((fail "never")))
    """)
    with pytest.raises(RuleError, match=f'no rule writes :[a-z]+ "{word}"'):
        load(rule_dirs([tmp_path / "w"]))


def test_a_clone_filter_reads_and_a_users_own_words_are_known(tmp_path):
    write_rules(tmp_path / "filter", """
        (phase mine :after cb-stage)
        (graph-rule copy-producer
          :doc "a clone keeping producer nodes, spelled wrong"
          :phase mine
          :match ((for ?L :part "consumer"))
          :rewrite ((clone ?L :keep (_ :stage "producr"))))
    """)
    with pytest.raises(RuleError, match='no rule writes :stage "producr"'):
        load(rule_dirs([tmp_path / "filter"]))
    write_rules(tmp_path / "own", """
        (vocabulary tag "from-my-builder")
        (phase mine :after cb-stage)
        (graph-rule mark
          :doc "writes a word of its own"
          :phase mine
          :match ((wgmma_commit ?c :tag (not "mine")))
          :rewrite ((set ?c :tag "mine")))
        (graph-rule read-them
          :doc "reads it, and a declared one"
          :phase mine
          :match ((wgmma_commit ?c :tag (one-of "mine" "from-my-builder")))
          :rewrite ((fail "not reached in this test")))
    """)
    rs = load(rule_dirs([tmp_path / "own"]))
    assert "from-my-builder" in rs.vocabulary.declared["tag"]


@pytest.mark.parametrize("form,message", [
    ('(vocabulary colour "red")', "declares words of tag, stage, part, circular_buffer, tma_store; got colour"),
    ("(vocabulary tag mine)", 'takes words in quotes, got mine'),
    ("(vocabulary)", "got nothing"),
])
def test_a_malformed_vocabulary_form_is_refused(tmp_path, form, message):
    write_rules(tmp_path / "v", form + "\n")
    with pytest.raises(RuleError, match=message):
        load(rule_dirs([tmp_path / "v"]))


def test_an_option_key_no_rule_writes_is_an_error_and_set_option_declares_one(tmp_path):
    write_rules(tmp_path / "key", """
        (phase mine :before cb-check)
        (graph-rule my-prefetch
          :doc "an option key spelled wrong"
          :phase mine
          :match ((for ?L :annotations (:circular_buffer (:stages ?S :prefetc (absent)))))
          :rewrite ((set-option ?L "circular_buffer" :prefetch 1)))
    """)
    with pytest.raises(RuleError, match=r"test.rules:5:62: rule my-prefetch: no rule writes option :prefetc of "
                                        r"circular_buffer .*did you mean 'prefetch'"):
        load(rule_dirs([tmp_path / "key"]))
    write_rules(tmp_path / "own", """
        (phase mine :before cb-check)
        (graph-rule mark
          :doc "a key of its own, written and read"
          :phase mine
          :match ((for ?L :annotations (:circular_buffer (:stages ?S :seen (absent)))))
          :rewrite ((set-option ?L "circular_buffer" :seen true)))
    """)
    assert load(rule_dirs([tmp_path / "own"]))
