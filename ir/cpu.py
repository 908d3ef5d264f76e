"""What LLVM knows about CPUs, for :class:`~tensorfuse.ir.target.Target` and the LLVM code
generator (``codegen.llvm.jit``): this machine's triple, CPU name and features
(:func:`host_info`, :func:`isa_feature_names`) and, asked of LLVM in a child process, the CPUs and
features it knows and what a CPU with some features has (:func:`query_target`).

They live here, below ``codegen``, because ``Target`` validates and resolves its ``-mcpu`` /
``-mattr`` options with them. Tests that pretend to run on another CPU replace
``tensorfuse.ir.cpu.host_info`` (``codegen.llvm.jit.host_info`` calls it).

What LLVM knows about CPUs other than this one is asked of LLVM itself, in a child process: LLVM
prints its CPU and feature names (``-mcpu=help``) and only warns about an unknown name, and some
CPU/feature combinations abort the process (a 32-bit CPU for a 64-bit triple), so the parent
never creates a target machine LLVM has not accepted.
"""
from __future__ import annotations

import functools
import json
import os
import subprocess
import sys

import llvmlite.binding as llvm


@functools.lru_cache(maxsize=None)
def init_native() -> None:
    """Initialise LLVM's native target and assembly printer (once per process)."""
    llvm.initialize_native_target()
    llvm.initialize_native_asmprinter()


def host_info() -> dict:
    """Triple, CPU name and feature string (``"+avx2,-avx512f,..."``, every feature LLVM's host
    detection knows, sorted) of this machine."""
    init_native()
    return {"triple": llvm.get_process_triple(), "cpu": llvm.get_host_cpu_name(),
            "features": llvm.get_host_cpu_features().flatten()}


@functools.lru_cache(maxsize=None)
def isa_feature_names() -> tuple:
    """Names of the CPU features LLVM's host detection reports on this machine (enabled or
    not): the instruction-set features a CPU has or lacks, sorted."""
    init_native()
    return tuple(sorted(llvm.get_host_cpu_features()))


# ----------------------------------------------------------------------------- asking LLVM
# Run in a child process: prints one JSON line per stage, so the parent knows how far it got
# if LLVM aborts (LLVM ERROR ...).
_QUERY_SCRIPT = r"""
import json, os, sys, tempfile
import llvmlite.binding as llvm
llvm.initialize_native_target(); llvm.initialize_native_asmprinter()
triple, cpu, features, keys = sys.argv[1], sys.argv[2], sys.argv[3], json.loads(sys.argv[4])
target = llvm.Target.from_triple(triple)

def say(**kw):
    sys.stdout.write(json.dumps(kw) + "\n"); sys.stdout.flush()

# 1. the CPU and feature names: LLVM prints them to stderr for cpu "help" / feature "+help"
saved = os.dup(2)
with tempfile.TemporaryFile() as tmp:
    os.dup2(tmp.fileno(), 2)
    try:
        target.create_target_machine(cpu="help", features="+help")
    finally:
        os.dup2(saved, 2)
    tmp.seek(0)
    text = tmp.read().decode("utf-8", "replace")
cpus, feats, section = [], [], None
for line in text.splitlines():
    if line.startswith("Available CPUs"):
        section = cpus
    elif line.startswith("Available features"):
        section = feats
    elif section is not None and line.startswith("  ") and " - " in line:
        section.append(line.split()[0])
say(cpus=cpus, features=feats)
if cpu not in cpus:        # unknown names only make LLVM warn: the parent reports them
    sys.exit(0)

# 2. which features (of keys) the CPU with these features has: a callee whose features are the
# caller's plus one is inlined exactly when the caller already has it (LLVM inlines only into
# functions whose feature bits are a superset); the volatile store keeps the call alive until then
attr = lambda fs, n: f'attributes #{n} = {{ "target-cpu"="{cpu}" "tune-cpu"="generic" "target-features"="{fs}" }}'
lines, attrs = [f'target triple = "{triple}"', "@g = global i32 0"], [attr(features, 0)]
for i, f in enumerate(keys):
    lines.append(f"define internal void @c{i}() #{i + 1} {{\n  store volatile i32 {i}, ptr @g\n  ret void\n}}")
    lines.append(f"define void @p{i}() #0 {{\n  call void @c{i}()\n  ret void\n}}")
    attrs.append(attr((features + "," if features else "") + "+" + f, i + 1))
mod = llvm.parse_assembly("\n".join(lines + attrs))
tm = target.create_target_machine(opt=1)
pb = llvm.create_pass_builder(tm, llvm.create_pipeline_tuning_options(speed_level=1))
pb.getModulePassManager().run(mod, pb)
say(enabled=[f for i, f in enumerate(keys) if "call" not in str(mod.get_function(f"p{i}"))])

# 3. LLVM can generate code for it (some feature sets abort code generation)
ir = '''
define float @f(float %a, float %b, double %c, <8 x float> %v, ptr %p, i64 %n) {
  %x = fmul float %a, %b
  %y = call float @llvm.fma.f32(float %x, float %a, float %b)
  %d = fptrunc double %c to float
  %w = fadd <8 x float> %v, %v
  store <8 x float> %w, ptr %p
  %e = extractelement <8 x float> %w, i32 0
  %s = fadd float %y, %d
  %t = fadd float %s, %e
  %q = sitofp i64 %n to float
  %r = fdiv float %t, %q
  ret float %r
}
declare float @llvm.fma.f32(float, float, float)
'''
tm = target.create_target_machine(cpu=cpu, features=features, opt=3, reloc="pic", codemodel="jitdefault")
m = llvm.parse_assembly(ir)
m.triple = triple
tm.emit_object(m)
say(codegen="ok")
"""


@functools.lru_cache(maxsize=None)
def query_target(triple: str, cpu: str = "", features: str = "") -> dict:
    """Ask LLVM (in a child process, once per arguments) about a target. Returns
    ``{"cpus": [...], "llvm_features": [...]}`` (every CPU and feature name LLVM knows for
    ``triple``) and, when ``cpu`` is one of them and every feature of ``features`` (a
    ``"+a,-b"`` string) is known, ``"enabled"``: the names of :func:`isa_feature_names` that
    the CPU has with those features applied (in order, with LLVM's implications: ``-avx2``
    also turns off AVX-512). ``"error"`` is set when LLVM aborted on the combination (then
    code cannot be generated for it). Raises RuntimeError if the child fails to start."""
    cmd = [sys.executable, "-c", _QUERY_SCRIPT, triple, cpu, features, json.dumps(list(isa_feature_names()))]
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=dict(os.environ))
    except (OSError, subprocess.TimeoutExpired) as e:
        raise RuntimeError(f"cannot ask LLVM about target {cpu or triple!r}: {e}") from None
    out: dict = {}
    for line in r.stdout.splitlines():
        try:
            out.update(json.loads(line))
        except ValueError:
            pass
    if "cpus" not in out:
        raise RuntimeError(f"cannot ask LLVM about target {cpu or triple!r}: the query process failed "
                           f"({r.returncode}): {r.stderr.strip()[-2000:]}")
    result = {"cpus": out["cpus"], "llvm_features": out["features"]}
    if "enabled" in out:
        result["enabled"] = out["enabled"]
    if r.returncode != 0:
        errs = [ln.strip() for ln in r.stderr.splitlines() if "LLVM ERROR" in ln or "error" in ln.lower()]
        result["error"] = errs[-1] if errs else f"the LLVM process ended with status {r.returncode}"
    return result
