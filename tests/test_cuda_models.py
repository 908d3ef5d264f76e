"""Every shared model compiles for the cuda target, and the CNNs' layout reports leave at most 2
Transposes, at the graph input and output (issue 10, acceptance 3).

Compile only, no run: one subprocess with ``NUMBA_ENABLE_CUDASIM=1`` (this process imported
numba without it, and ``compile(target="cuda")`` needs a GPU or the simulator) compiles every
model in ``../shared/models/models.json`` with ``cache=False`` and prints each one's layout
report as JSON; the tests read it. Skips (fails under TENSORFUSE_REQUIRE_SHARED=1) without the
shared models, like tests/test_models.py.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from conftest import shared_model_entries, shared_models_dir

pytestmark = [pytest.mark.slow, pytest.mark.shared]

#: the CNNs whose layout report must leave at most 2 Transposes, at the graph boundary
CNNS = ("resnet18", "mobilenet_v2", "squeezenet1_1")

_SCRIPT = r"""
import json, sys, time
import tensorfuse
out = {}
for path in sys.argv[1:]:
    t0 = time.perf_counter()
    try:
        m = tensorfuse.compile(path, target="cuda", cache=False)
        r = m.layout_report
        out[path] = {"ok": True, "target": m.target, "kernels": len(m.library.kernel_names),
                     "layout": None if r is None else
                     {"count": r.count, "bytes": r.bytes, "text": str(r),
                      "transposes": [{"node": t.node, "where": t.where, "nbytes": t.nbytes} for t in r.transposes]}}
    except Exception as e:
        out[path] = {"ok": False, "error": f"{type(e).__name__}: {e}"}
    out[path]["seconds"] = round(time.perf_counter() - t0, 2)
print("RESULT " + json.dumps(out))
"""

_ENTRIES = shared_model_entries() or [{"file": "<absent>"}]


@pytest.fixture(scope="module")
def compiled():
    d = shared_models_dir()
    paths = [str(d / e["file"]) for e in shared_model_entries()]
    env = dict(os.environ, NUMBA_ENABLE_CUDASIM="1")
    p = subprocess.run([sys.executable, "-c", _SCRIPT, *paths], capture_output=True, text=True, env=env,
                       timeout=600)
    lines = [ln for ln in p.stdout.splitlines() if ln.startswith("RESULT ")]
    assert p.returncode == 0 and lines, f"the compile subprocess failed (exit {p.returncode}):\n{p.stderr[-3000:]}"
    res = json.loads(lines[-1][len("RESULT "):])
    return {os.path.basename(k): v for k, v in res.items()}


@pytest.mark.parametrize("entry", _ENTRIES, ids=[e["file"] for e in _ENTRIES])
def test_shared_model_compiles_for_cuda(entry, compiled):
    r = compiled[entry["file"]]
    assert r["ok"], f"{entry['file']}: compile(target='cuda') failed: {r.get('error')}"
    assert r["target"] == "cuda" and r["kernels"] > 0


@pytest.mark.parametrize("arch", CNNS)
def test_cnn_layout_leaves_transposes_only_at_the_boundary(arch, compiled):
    entries = [e for e in shared_model_entries() if e.get("architecture") == arch]
    if not entries:
        pytest.skip(f"no {arch} in models.json")
    for e in entries:
        r = compiled[e["file"]]
        assert r["ok"], r.get("error")
        lay = r["layout"]
        assert lay is not None, f"{e['file']}: no layout report (the NHWC layout pass did not run)"
        assert lay["count"] <= 2, f"{e['file']}:\n{lay['text']}"
        for t in lay["transposes"]:
            w = t["where"]
            assert w.startswith("graph input") or w.endswith("graph output"), f"{e['file']}: {t['node']}: {w}"
        assert lay["bytes"] == sum(t["nbytes"] for t in lay["transposes"])
