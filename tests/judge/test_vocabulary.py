"""One vocabulary: every phase, state, group phase and verdict kind produced, compared or styled anywhere is in
snapshot.py's."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from trainwatch.probes import snapshot
from trainwatch.probes.judge import groups, native, verdict
from trainwatch.probes.snapshot import GROUP_PHASES, PHASES, STATES, VERDICTS
from trainwatch.tui.widgets import lines

ROOT = Path(__file__).resolve().parents[2]
SOURCES = sorted(p for d in ("probes", "tui") for p in (ROOT / d).rglob("*.py"))
VOCABULARY = {"phase": set(PHASES), "state": set(STATES), "kind": set(VERDICTS), "group_phase": set(GROUP_PHASES)}
OTHER_PHASES = {"p.phase"}  # a Kubernetes pod's phase (tui/remote_args.py), not a rank's


def test_the_tuples_are_the_literals():
    assert len(set(PHASES)) == len(PHASES) and len(set(STATES)) == len(STATES) and len(set(VERDICTS)) == len(VERDICTS)
    assert snapshot.WAITING_PHASES <= set(PHASES)
    assert snapshot.HANG_VERDICTS <= snapshot.PROBLEM_VERDICTS <= set(VERDICTS)
    assert native.AMBIGUOUS_PHASES <= set(PHASES) and verdict.PEER_WAITS <= set(PHASES)
    assert snapshot.UNJUDGED_VERDICTS <= set(VERDICTS) and not snapshot.UNJUDGED_VERDICTS & snapshot.PROBLEM_VERDICTS
    assert set(PHASES) < set(GROUP_PHASES) and len(set(GROUP_PHASES)) == len(GROUP_PHASES)


def test_a_group_phase_is_a_phase_or_how_its_ranks_ended():
    from trainwatch.probes.snapshot import ExitInfo, Rank
    ranks = [Rank(rank=0, state="missing"), Rank(rank=1, state="exited", exit=ExitInfo(code=1)),
             Rank(rank=2, state="stuck", phase="collective", op="all_reduce", where="t.py:1 f")]
    assert {groups.group_key(r)[0] for r in ranks} == {"missing", "exited", "collective"}
    assert {g.phase for g in groups.group_ranks(ranks)} <= set(GROUP_PHASES)


def test_every_verdict_and_state_has_a_style_and_every_styled_phase_exists():
    assert set(lines.VERDICT_STYLES) == set(VERDICTS)
    assert set(lines.STATE_STYLES) == set(STATES)
    assert set(lines.PHASE_STYLES) <= set(PHASES)


def _strings(node: ast.AST) -> list[str] | None:
    """The string constants of ``"x"`` or ``("x", "y")``/``{...}``/``[...]``; None for anything else."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [node.value]
    if isinstance(node, (ast.Tuple, ast.Set, ast.List)):
        found = [e.value for e in node.elts if isinstance(e, ast.Constant) and isinstance(e.value, str)]
        return found if len(found) == len(node.elts) else None
    return None


def _word(node: ast.AST) -> str | None:
    """``phase``/``state``/``kind`` for ``x.phase``, ``x.state``, ``verdict.kind`` or a local ``phase``."""
    if isinstance(node, ast.Attribute) and node.attr == "phase" and "group" in ast.unparse(node.value).lower():
        return "group_phase"
    if isinstance(node, ast.Attribute) and node.attr in ("phase", "state") and ast.unparse(node) not in OTHER_PHASES:
        return node.attr
    if isinstance(node, ast.Attribute) and node.attr == "kind" and "verdict" in ast.unparse(node.value).lower():
        return "kind"
    if isinstance(node, ast.Name) and node.id == "phase":
        return "phase"
    return None


def _uses(tree: ast.AST):
    """(word, string, line) for each vocabulary word written in the code."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare) and (word := _word(node.left)):
            for right in node.comparators:
                for text in _strings(right) or ():
                    yield word, text, node.lineno
        elif isinstance(node, ast.Call):
            name = ast.unparse(node.func)
            for kw in node.keywords:
                if kw.arg in ("phase", "state") or (kw.arg == "kind" and name in ("Verdict", "replace")):
                    word = "group_phase" if name == "Group" and kw.arg == "phase" else kw.arg
                    for text in _strings(kw.value) or ():
                        yield word, text, node.lineno
            if name in ("Verdict", "Classification", "Group") and node.args:
                word = {"Verdict": "kind", "Classification": "phase", "Group": None}[name]
                for text in (_strings(node.args[0]) or ()) if word else ():
                    yield word, text, node.lineno
        elif isinstance(node, ast.FunctionDef) and node.name in ("_phase_of", "group_key"):  # phases produced
            word = "phase" if node.name == "_phase_of" else "group_phase"
            for ret in ast.walk(node):
                if isinstance(ret, ast.Return) and isinstance(ret.value, ast.Tuple):
                    for text in _strings(ret.value.elts[0]) or ():
                        yield word, text, ret.lineno


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_phase_state_and_verdict_written_in_the_code_is_known(path):
    unknown = [f"{path.name}:{line} {word} {text!r}" for word, text, line in _uses(ast.parse(path.read_text()))
               if text not in VOCABULARY[word]]
    assert not unknown


def test_the_scan_sees_the_classifier_and_the_judge():
    found = {(p.name, w, t) for p in SOURCES for w, t, _ in _uses(ast.parse(p.read_text()))}
    assert {t for name, w, t in found if name == "phases.py" and w == "phase"} == set(PHASES)
    assert {t for name, w, t in found if name == "verdict.py" and w == "kind"} >= set(VERDICTS) - {"unknown"}
    assert {t for name, w, t in found if name == "groups.py" and w == "group_phase"} >= {"missing", "exited"}
