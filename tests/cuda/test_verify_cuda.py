"""``tensorfuse.verify`` on the cuda target (simulator): the per-group comparison launches each
kernel call alone and reads its values back from the device (it read the CPU slot table and
failed with AttributeError on cuda modules: found by a new-user trial of the README)."""
import os

os.environ.setdefault("NUMBA_ENABLE_CUDASIM", "1")

import pathlib
import sys

import onnx

import tensorfuse

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))
from cli_util import bn_chain  # noqa: E402


def test_verify_compares_the_groups_of_a_cuda_module(tmp_path):
    p = tmp_path / "bn.onnx"
    onnx.save(bn_chain(1), str(p))
    res = tensorfuse.verify(str(p), 2, target="cuda")
    assert res.ok and res.culprit is None and res.first_bad_group is None
    assert res.groups_compared >= 1
