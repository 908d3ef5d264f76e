"""Writing output files never destroys what the path names (issue 24, item 1): ``Module.save``,
``export_onnx``, ``DotGraph.write`` and every ``-o`` of the command line (``runtime.outfile``).

A regular file or a new path is replaced atomically; a symbolic link is written through to its
target; a device node or a FIFO is written into and stays what it was; a failed write (ENOSPC on
a full device, a folder that cannot be written) is exit 2 with the reason and no ``wrote``; the
folder of an output is never created.

Safety: nothing here writes to /dev/null or to another device of the machine. The full device
is a node made in tmp_path (``mknod``, major 1 minor 7, what /dev/full is) where the process may
make one (root, as in containers and CI); else /dev/full itself, which only the fixed code can
be pointed at without harm (the unfixed code replaced it with a regular file). The folder that
cannot be written is /sys (sysfs refuses new files even to root, for whom a chmod'ed folder is
no obstacle).
"""
from __future__ import annotations

import io
import json
import os
import stat
import threading
import zipfile

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import tensorfuse
from cli_util import cli, run_cli
from oracle import ort_run


def _model() -> onnx.ModelProto:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])
    nodes = [helper.make_node("Relu", ["x"], ["r"], name="relu"), helper.make_node("Tanh", ["r"], ["y"], name="tanh")]
    return helper.make_model(helper.make_graph(nodes, "small", [x], [y]), opset_imports=[helper.make_opsetid("", 17)])


@pytest.fixture(scope="module")
def model_path(tmp_path_factory):
    p = tmp_path_factory.mktemp("outfiles") / "small.onnx"
    onnx.save(_model(), str(p))
    return p


@pytest.fixture(scope="module")
def module():
    return tensorfuse.compile(_model())


@pytest.fixture
def full_device(tmp_path):
    """A character device that fails every write with ENOSPC: a /dev/full node of our own in
    tmp_path where mknod is allowed, else /dev/full (checked to be intact afterwards)."""
    node = tmp_path / "full"
    try:
        os.mknod(node, stat.S_IFCHR | 0o666, os.makedev(1, 7))
        with open(node, "wb", buffering=0) as f:        # usable (not a nodev mount)?
            try:
                f.write(b"x")
            except OSError as e:
                assert e.errno == 28
        path = str(node)
    except OSError:
        path = "/dev/full"
    yield path
    assert stat.S_ISCHR(os.stat(path).st_mode), f"{path} is no longer a device"
    assert stat.S_ISCHR(os.stat("/dev/full").st_mode) and stat.S_ISCHR(os.stat("/dev/null").st_mode)


def _fifo_reader(path):
    """Read everything written to the FIFO ``path`` in a thread; ``join()`` returns the bytes."""
    got = {}

    def read():
        with open(path, "rb") as f:
            got["data"] = f.read()

    t = threading.Thread(target=read, daemon=True)
    t.start()

    def join():
        t.join(60)
        assert not t.is_alive(), "the writer never closed the FIFO"
        return got["data"]
    return join


# ----------------------------------------------------------------------------- the library
def test_save_into_a_full_device_is_an_error_and_leaves_the_device(module, full_device):
    with pytest.raises(tensorfuse.ArtifactError, match="No space left on device"):
        module.save(full_device)
    assert stat.S_ISCHR(os.stat(full_device).st_mode)


def test_save_into_a_fifo_streams_a_loadable_module(module, tmp_path):
    fifo = tmp_path / "pipe.tfm"
    os.mkfifo(fifo)
    join = _fifo_reader(fifo)
    module.save(fifo)
    data = join()
    assert stat.S_ISFIFO(os.stat(fifo).st_mode), "the FIFO was replaced"
    copy = tmp_path / "copy.tfm"
    copy.write_bytes(data)
    x = np.linspace(-2, 2, 6, dtype=np.float32).reshape(2, 3)
    (got,) = tensorfuse.load(copy).run(x)
    (want,) = ort_run(_model(), {"x": x})
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)


def test_save_through_symlinks(module, tmp_path):
    target = tmp_path / "real.tfm"
    target.write_bytes(b"old")
    os.chmod(target, 0o640)
    link = tmp_path / "link.tfm"
    link.symlink_to(target)
    module.save(link)
    assert link.is_symlink() and os.readlink(link) == str(target)
    assert stat.S_IMODE(os.stat(target).st_mode) == 0o640          # the file's permissions kept
    assert tensorfuse.load(target).output_names == ["y"]
    dangling = tmp_path / "dangling.tfm"
    dangling.symlink_to(tmp_path / "new.tfm")
    module.save(dangling)
    assert dangling.is_symlink() and (tmp_path / "new.tfm").is_file()
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".tmp-")] == []


def test_save_into_a_missing_folder_creates_nothing(module, tmp_path):
    out = tmp_path / "no" / "such" / "m.tfm"
    with pytest.raises(tensorfuse.ArtifactError, match=f"the folder {tmp_path / 'no' / 'such'} does not exist"):
        module.save(out)
    assert not (tmp_path / "no").exists()


def test_outfile_rules(tmp_path, full_device):
    from tensorfuse.runtime.outfile import OutputError, classify, write_bytes
    assert classify(tmp_path / "new")[0] == "new"
    (tmp_path / "f").write_bytes(b"")
    assert classify(tmp_path / "f")[0] == "regular"
    assert classify(full_device)[0] == "special"
    with pytest.raises(OutputError, match="it is a folder"):
        write_bytes(tmp_path, b"x")
    with pytest.raises(OutputError, match="is not a folder"):
        write_bytes(tmp_path / "f" / "below-a-file", b"x")
    with pytest.raises(OutputError, match="No space left on device") as e:
        write_bytes(full_device, b"x" * 100000)
    assert e.value.errno == 28
    with pytest.raises(OutputError, match=r"cannot write /sys/tensorfuse-test\.tfm: (Permission denied|Read-only)"):
        write_bytes("/sys/tensorfuse-test.tfm", b"x")


def test_export_onnx_writes_through_a_symlink_and_into_a_fifo(module, tmp_path):
    target = tmp_path / "opt.onnx"
    link = tmp_path / "link.onnx"
    link.symlink_to(target)
    tensorfuse.export_onnx(module.graph, link)
    assert link.is_symlink() and onnx.load(str(target)).graph.node
    fifo = tmp_path / "opt-pipe.onnx"
    os.mkfifo(fifo)
    join = _fifo_reader(fifo)
    tensorfuse.export_onnx(module.graph, fifo)
    m = onnx.load_model_from_string(join())
    assert stat.S_ISFIFO(os.stat(fifo).st_mode) and [o.name for o in m.graph.output] == ["y"]


# ----------------------------------------------------------------------------- the command line
def _failed_write(r, command: str, reason: str):
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert "wrote" not in r.stdout, r.stdout
    assert r.stderr.startswith(f"tensorfuse {command}: error: cannot write "), r.stderr
    assert reason in r.stderr, r.stderr
    assert "Traceback" not in r.stderr


def test_cli_compile_into_a_full_device_is_exit_2(model_path, full_device):
    r = run_cli("compile", model_path, "-o", full_device)         # the real process and exit path
    _failed_write(r, "compile", "No space left on device")
    assert "hint: the device or file system is full" in r.stderr


def test_cli_run_and_graph_into_a_full_device_are_exit_2(model_path, full_device, tmp_path):
    _failed_write(cli("run", model_path, "-o", full_device), "run", "No space left on device")
    link = tmp_path / "g.dot"                   # graph -o wants a picture's extension
    link.symlink_to(full_device)
    _failed_write(cli("graph", model_path, "-o", link), "graph", "No space left on device")
    assert link.is_symlink()


def test_cli_outputs_into_fifos(model_path, tmp_path):
    fifo = tmp_path / "m.tfm"
    os.mkfifo(fifo)
    join = _fifo_reader(fifo)
    r = cli("compile", model_path, "-o", fifo)
    data = join()
    assert r.returncode == 0 and f"wrote {fifo}" in r.stdout, r.stderr
    assert stat.S_ISFIFO(os.stat(fifo).st_mode) and data[:4] == b"PK\x03\x04"

    npz = tmp_path / "out"                      # a FIFO gets no .npz appended
    os.mkfifo(npz)
    join = _fifo_reader(npz)
    r = cli("run", model_path, "-o", npz)
    with np.load(io.BytesIO(join())) as z:
        y = z["y"]
    assert r.returncode == 0 and f"wrote {npz}\n" in r.stdout, r.stderr
    assert stat.S_ISFIFO(os.stat(npz).st_mode) and not (tmp_path / "out.npz").exists()
    assert y.shape == (2, 3) and np.all(y >= 0) and np.all(y < 1)     # tanh(relu(x))

    dot = tmp_path / "g.dot"
    os.mkfifo(dot)
    join = _fifo_reader(dot)
    r = cli("graph", model_path, "-o", dot)
    text = join().decode()
    assert r.returncode == 0 and text.startswith("digraph") and stat.S_ISFIFO(os.stat(dot).st_mode)


@pytest.mark.parametrize("command", ["compile", "run", "graph"])
def test_cli_output_into_a_missing_folder_is_exit_2_and_creates_nothing(model_path, tmp_path, command):
    out = tmp_path / "nonexistent" / "dir" / {"compile": "m.tfm", "run": "out.npz", "graph": "g.dot"}[command]
    r = cli(command, model_path, "-o", out)
    _failed_write(r, command, f"the folder {tmp_path / 'nonexistent' / 'dir'} does not exist")
    assert "hint: create the folder first" in r.stderr
    assert not (tmp_path / "nonexistent").exists()
    assert "compiled" not in r.stdout                   # refused before the work


@pytest.mark.parametrize("command", ["compile", "run", "graph"])
def test_cli_output_into_an_unwritable_folder_is_exit_2(model_path, command):
    out = "/sys/" + {"compile": "tensorfuse-test.tfm", "run": "tensorfuse-test.npz", "graph": "tensorfuse-test.dot"}[command]
    r = cli(command, model_path, "-o", out)
    assert r.returncode == 2 and "wrote" not in r.stdout, (r.stdout, r.stderr)
    assert f"cannot write {out}: " in r.stderr and ("Permission denied" in r.stderr or "Read-only" in r.stderr), r.stderr
    assert not os.path.exists(out)


def test_cli_compile_to_stdout_on_a_pipe(model_path):
    # /dev/stdout on a pipe links to "pipe:[N]", which is no path: the device is opened as given
    import subprocess
    import sys
    r = subprocess.run([sys.executable, "-m", "tensorfuse", "compile", str(model_path), "-o", "/dev/stdout"],
                       capture_output=True, timeout=300)
    assert r.returncode == 0, r.stderr.decode()[-2000:]
    start = r.stdout.index(b"PK\x03\x04")
    end = r.stdout.rindex(b"PK\x05\x06") + 22                   # the end of central directory record
    with zipfile.ZipFile(io.BytesIO(r.stdout[start:end])) as z:
        assert json.loads(z.read("tensorfuse.json"))["outputs"][0]["name"] == "y"
    assert b"wrote /dev/stdout" in r.stdout
