"""Test helpers: what codegen produced for a module (LLVM IR text), not how its kernels print.

A kernel is *parallel* when ``codegen.llvm.emit.kernel_is_parallel`` says its top-level nest
splits work across threads AND the module's entry (``emit_entry``) hands it the team record:
``call void @"<kernel>"(ptr %"args", ptr %"<entry's team parameter>")``; a serial kernel gets
``ptr null`` (it then runs every iteration on thread 0).
"""
from __future__ import annotations

import re

from tensorfuse.codegen.llvm.emit import kernel_is_parallel
from tensorfuse.codegen.llvm.jit import compile_ir
from tensorfuse.ir.schedule import all_loops as kernel_loops, expr_nodes  # noqa: F401  (for the tests)

ENTRY = "tf_run"
_NAME = r'(?:"([^"]+)"|([\w.$-]+))'


def function_ir(ir_text: str, name: str) -> str:
    """The ``define ... @name(...) { ... }`` text of one function (quoted or bare name)."""
    pat = r'^define [^\n]*@(?:"%s"|%s)\(.*?^}' % (re.escape(name), re.escape(name))
    m = re.search(pat, ir_text, re.S | re.M)
    assert m is not None, f"no function {name} in the IR"
    return m.group(0)


def _unq(m, i=1) -> str:
    return m.group(i) if m.group(i) is not None else m.group(i + 1)


#: the phase protocol's helpers (``codegen.llvm.emit.phase_helpers``), which entry_calls leaves out
PHASE_HELPERS = ("tf_claim", "tf_wait", "tf_phase_end")


def entry_calls(ir_text: str, entry: str = ENTRY) -> list[tuple[str, bool]]:
    """(callee, team passed) for each kernel call the entry makes, in order (the phase helpers
    it calls are left out)."""
    body = function_ir(ir_text, entry)
    head = body.splitlines()[0]
    params = re.findall(r'ptr (?:[\w() ]+ )?%' + _NAME, head)
    assert len(params) == 2, head
    team = params[1][0] or params[1][1]
    out = []
    for m in re.finditer(r'call void @' + _NAME + r'\(([^)]*)\)', body):
        callee = _unq(m)
        if callee in PHASE_HELPERS:
            continue
        last = m.group(3).split(",")[-1].strip()
        passed = last in (f'ptr %"{team}"', f"ptr %{team}")
        assert passed or last == "ptr null", f"unexpected argument {last!r} in {m.group(0)}"
        out.append((callee, passed))
    return out


def team_kernels(ir_text: str, entry: str = ENTRY) -> set[str]:
    """Kernels the entry calls with the team record (every one of their calls)."""
    calls = entry_calls(ir_text, entry)
    return {k for k, _ in calls} - {k for k, p in calls if not p}


def parallel_kernels(mod) -> set[str]:
    """Names of the module's kernels that split work across the thread team: parallel in the
    kernel IR and handed the team by the entry."""
    return {k.name for k in mod.kernels if kernel_is_parallel(k)} & team_kernels(mod.llvm_ir)


def optimized_ir(mod) -> str:
    """The module's LLVM IR after optimisation, for the module's target (the Module keeps
    only the unoptimised text: ``compile_ir`` returns the optimised one, which we regenerate
    under the module's own name, so the test session's LLVM memo, tests/conftest.py, serves it)."""
    m = re.match(r'; ModuleID = "(.*)"', mod.llvm_ir)
    return compile_ir(mod.llvm_ir, m.group(1) if m else "inspect", target=mod.target)[2]


def float_vectors(ir_text: str) -> set[int]:
    """Widths n of the ``<n x float>`` types in an IR text."""
    return {int(n) for n in re.findall(r"<(\d+) x float>", ir_text)}


def calls_fmuladd(ir_text: str, lanes: int) -> bool:
    return re.search(r'@"?llvm\.fmuladd\.v%df32"?\(' % lanes, ir_text) is not None


def module_team(mod):
    """The thread team of the module's pooled arena (None at one thread), after a run."""
    assert mod._pool, "run the module first"
    return mod._pool[-1].team


def run_on_team(mod, feeds: dict, check, tries: int = 20) -> list:
    """Run ``mod`` on ``feeds`` (each run's outputs checked by ``check(outputs, run_index)``)
    until its workers have run at least one chunk of work; returns the last outputs. A threaded
    test must exercise the workers, not only the calling thread, and with dynamic chunks the
    caller may take them all (a small job, a worker waiting for a core on a loaded machine):
    after ``tries`` runs without a worker chunk, one more run where the calling thread claims
    none (``ThreadTeam.set_claims``), so the workers run every chunk. Runs in debug mode check
    the memory plan on the team (``Module._run_checked``) as plain runs do."""
    outs = None
    for i in range(tries + 1):
        team = module_team(mod) if mod._pool else None
        if team is not None:
            team.adaptive = False   # every run on the team (not alone: ThreadTeam.run)
            team.set_claims(0, i < tries)
        try:
            outs = mod.run(**feeds)
        finally:
            if team is not None:
                team.set_claims(0, True)
        check(outs, i)
        team = module_team(mod)
        if team is None or team.chunks_run()[1:].sum() > 0:
            return outs
    raise AssertionError(f"{tries + 1} runs at {mod.num_threads} threads: no worker ran a chunk "
                         f"(chunks per thread: {module_team(mod).chunks_run().tolist()})")
