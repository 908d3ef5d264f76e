"""The cuda module: a compiled model whose kernels run on an NVIDIA GPU through numba.cuda.

Memory (docs/architecture.md "Runtime"): one device arena per run in flight, allocated once and
kept in a pool (after the first run, ``run()`` allocates nothing on the device unless it returns
device arrays). The arena holds the intermediates at the offsets of the static memory plan
(planned with 256-byte alignment), then each input, output and the run-time check status word at
256-byte aligned offsets of their own; every slot is a flat (1-D, C-contiguous) typed view into
it. Constants are uploaded once, when the module is made, into one device buffer shared by all
arenas (kernels never write them).

A run copies its numpy inputs host-to-device into their views; an input that is already on the
device (a numba device array, or any object with ``__cuda_array_interface__``: CuPy arrays,
PyTorch CUDA tensors) is checked from its interface and bound directly, with no copy at all.
Every kernel call of the program is launched in order on the default stream
(``library.launch(kernel, [view of each slot])``, the contract of ``codegen.cuda.jit``), then
``cuda.synchronize()``; a reshape the memory plan made an alias (``MemoryPlan.aliases``) is
no launch: its slot is bound to the view of the slot it reshapes. The outputs are copied to
fresh numpy arrays, or with ``return_device=True`` written straight into fresh device arrays
that are returned.

Nothing here imports the compiler or a code generator: the library is whatever object honours
the launch contract (``codegen.cuda.jit.CudaLibrary``, or a test's fake).
"""
from __future__ import annotations

from . import cuda_compat  # noqa: F401  (numba-cuda on NumPy 2.5: before numba.cuda is imported)

import ctypes
import statistics
import threading
import time

import numpy as np

from .memory_plan import MemoryPlan
from .module import ModuleBase, RunCheckError, TensorInfo

#: byte alignment of every device view (the plan's offsets and the extra slots'); at least
#: what cudaMalloc gives and what vector loads of any dtype need
DEVICE_ALIGNMENT = 256


#: the CUDA simulator runs a kernel by swapping thread-local state into numba.cuda, so two
#: Python threads cannot launch at once there: simulated launches take this lock (a real GPU
#: takes launches from any number of threads)
_SIM_LAUNCH_LOCK = threading.Lock()


def _align(n: int, a: int = DEVICE_ALIGNMENT) -> int:
    return (n + a - 1) // a * a


#: what ``pip install 'tensorfuse[cuda]'`` adds (pyproject.toml): module name -> distribution
GPU_STACK = {"numba": "numba", "numba_cuda": "numba-cuda"}


def gpu_stack_missing() -> str | None:
    """None when the cuda target's Python packages (the extra ``tensorfuse[cuda]``: numba and
    numba-cuda) are installed, else the error text naming what is missing and the ``pip install``
    that adds it. Imports nothing (``importlib.util.find_spec``)."""
    import importlib.util
    missing = []
    for mod, dist in GPU_STACK.items():
        try:
            found = importlib.util.find_spec(mod) is not None
        except (ImportError, ValueError):         # None in sys.modules, a broken package
            found = False
        if not found:
            missing.append(dist)
    if not missing:
        return None
    return (f"the cuda target needs the GPU stack, and {' and '.join(missing)} "
            f"{'is' if len(missing) == 1 else 'are'} not installed: pip install 'tensorfuse[cuda]' "
            f"(numba, numba-cuda, NVVM and NVRTC; the CPU target needs none of them)")


def cuda_unavailable_reason() -> str | None:
    """Why cuda modules cannot run here, or None when they can. First the GPU stack must be
    installed (:func:`gpu_stack_missing`: ``pip install 'tensorfuse[cuda]'``). Quick (no compile): under the
    CUDA simulator (``NUMBA_ENABLE_CUDASIM=1``, read by numba when it is first imported;
    checked first, since ``cuda.is_available()`` is True there) they can; otherwise numba.cuda
    must import and find a driver and a GPU (``cuda.is_available()``; the reason then is
    ``cuda.cuda_error()``, e.g. "CUDA driver library cannot be found"), and libNVVM (which
    numba.cuda generates PTX with) must load."""
    missing = gpu_stack_missing()
    if missing is not None:
        return missing
    try:
        from numba.core import config
    except Exception as e:                                  # noqa: BLE001 - any import failure is the reason
        return f"numba cannot be imported ({type(e).__name__}: {e})"
    if config.ENABLE_CUDASIM:
        return None
    try:
        from numba import cuda
    except Exception as e:                                  # noqa: BLE001
        return f"numba.cuda cannot be imported ({type(e).__name__}: {e})"
    err = None
    try:
        available = cuda.is_available()
    except Exception as e:                                  # noqa: BLE001
        available, err = False, f"{type(e).__name__}: {e}"
    if not available:
        if err is None:
            try:
                err = cuda.cuda_error()
            except Exception as e:                          # noqa: BLE001
                err = f"{type(e).__name__}: {e}"
        err = " ".join(str(err or "no CUDA GPU was found").split())
        return (f"no usable CUDA GPU ({err}); run on a machine with an NVIDIA GPU and driver, or set "
                f"NUMBA_ENABLE_CUDASIM=1 before numba is imported to use the CUDA simulator")
    try:
        from numba.cuda.cudadrv import nvvm
        nvvm.NVVM()
    except Exception as e:                                  # noqa: BLE001
        msg = " ".join(str(e).split())
        return (f"libNVVM cannot be loaded ({msg}); install the nvidia-nvvm package "
                f"(pip install 'nvidia-nvvm==13.0.88') or the CUDA toolkit")
    return None


def simulated() -> bool:
    """True when numba.cuda is the CUDA simulator (``NUMBA_ENABLE_CUDASIM=1``)."""
    from numba.core import config
    return bool(config.ENABLE_CUDASIM)


def _cuda():
    """``numba.cuda``, or RuntimeError saying why cuda modules cannot run here."""
    reason = cuda_unavailable_reason()
    if reason is not None:
        raise RuntimeError(f"cannot run a cuda module here: {reason}")
    from numba import cuda
    return cuda


def _is_device_array(a) -> bool:
    """A numba device array (real or the simulator's) or an object exporting
    ``__cuda_array_interface__``."""
    if hasattr(a, "__cuda_array_interface__"):
        return True
    from numba import cuda
    try:
        return bool(cuda.cudadrv.devicearray.is_cuda_ndarray(a))
    except AttributeError:
        return False


def _interface(a) -> dict:
    """The ``__cuda_array_interface__`` dict of ``a``, or for a simulator device array (which
    exports none) an equivalent one of its host buffer."""
    iface = getattr(a, "__cuda_array_interface__", None)
    if iface is not None:
        return dict(iface)
    host = a._ary                                          # the simulator's FakeCUDAArray
    return {"shape": host.shape, "typestr": host.dtype.str,
            "strides": None if host.flags.c_contiguous else host.strides,
            "data": (host.ctypes.data, False), "version": 3}


def _as_flat_device(cuda, a, iface: dict, numel: int, dtype: np.dtype):
    """A 1-D device array of ``numel`` elements over the memory of ``a`` (no copy)."""
    if cuda.cudadrv.devicearray.is_cuda_ndarray(a):
        dev = a
    elif simulated():
        # the simulator's "device" memory is host memory: the interface points at it
        from numba.cuda.simulator.cudadrv.devicearray import FakeCUDAArray
        ptr = iface["data"][0]
        nbytes = numel * dtype.itemsize
        buf = (ctypes.c_char * max(nbytes, 1)).from_address(ptr) if ptr else bytearray(max(nbytes, 1))
        host = np.frombuffer(buf, np.uint8, count=nbytes).view(dtype)
        return FakeCUDAArray(host)
    else:
        dev = cuda.as_cuda_array(a)
    return dev.reshape(numel) if dev.shape != (numel,) else dev


class _CudaArena:
    """One run's device memory: the arena and a flat typed view per slot (constants are the
    module's shared views)."""

    def __init__(self, module: "CudaModule"):
        cuda = module._cuda
        self.buffer = cuda.device_array(max(module._arena_bytes, 1), np.uint8)
        self.views: dict[int, object] = dict(module._const_views)
        slots = module._program.slots
        for s, off in module._offsets.items():
            info = slots[s]
            n = int(np.prod(info.shape, dtype=np.int64))
            if n == 0:
                self.views[s] = cuda.device_array(0, info.dtype)
            else:
                self.views[s] = self.buffer[off:off + n * info.dtype.itemsize].view(info.dtype)


class CudaModule(ModuleBase):
    """A compiled model for an NVIDIA GPU (target "cuda"; see the module docstring).

    What every module has (:class:`~runtime.module.ModuleBase`: ``input_info``,
    ``output_info``, ``memory_plan``, ``report``, ``calls``, ``benchmark``, ``save`` ...), and
    ``library`` (the kernels: ``kernel_names``, ``sources``, ``launch``, ``launch_config``,
    ``to_blob``), ``cuda_sources`` (kernel name -> its numba.cuda Python source) and
    ``arena_bytes`` (device bytes of one arena: intermediates, inputs, outputs, status).

    Creating one needs a GPU or the simulator (RuntimeError with the reason otherwise) and
    uploads the constants.
    """

    backend = "cuda"

    def __init__(self, lowered, library, input_names, output_names, target: str = "cuda", *,
                 plan: MemoryPlan | None = None, report=None):
        """``lowered``: a :class:`~runtime.module.Program` (or a lowered graph); ``library``: the
        kernels (the ``codegen.cuda.jit.CudaLibrary`` contract: ``launch(name, args)``,
        ``launch_config(name)``, ``to_blob()``, ``kernel_names``, ``sources``); ``plan``: the
        memory plan (a saved one; default: planned here with 256-byte alignment). Raises
        RuntimeError when no GPU or simulator is available, ValueError for a plan whose
        alignment is not a multiple of 256 bytes."""
        super().__init__(lowered, input_names, output_names, target, plan=plan, report=report,
                         alignment=DEVICE_ALIGNMENT)
        if self.memory_plan.alignment % DEVICE_ALIGNMENT:
            raise ValueError(f"a cuda module's memory plan must be aligned to {DEVICE_ALIGNMENT} bytes, "
                             f"this one is aligned to {self.memory_plan.alignment}")
        self._cuda = _cuda()
        self._simulated = simulated()
        self._lib = library
        prog = self._program
        # the arena: the plan's intermediates, then inputs, outputs and the status word
        offsets = dict(self.memory_plan.offsets)
        end = _align(self.memory_plan.arena_bytes)
        extra = list(dict.fromkeys(list(prog.inputs) + list(prog.outputs)
                                   + ([prog.status_slot] if prog.status_slot is not None else [])))
        for s in extra:
            if s in offsets or s in prog.consts:
                continue
            offsets[s] = end
            end = _align(end + prog.slots[s].nbytes)
        self._offsets = offsets
        self._arena_bytes = end
        self._const_views = self._upload_consts()
        self._pool: list[_CudaArena] = []
        self._pool_lock = threading.Lock()

    def _upload_consts(self) -> dict[int, object]:
        """Every constant in one device buffer (256-byte aligned views), copied once."""
        cuda, consts = self._cuda, self._consts
        layout, off = {}, 0
        for s in sorted(consts):
            layout[s] = off
            off = _align(off + consts[s].nbytes)
        host = np.zeros(max(off, 1), np.uint8)
        for s, o in layout.items():
            a = np.ascontiguousarray(consts[s]).reshape(-1).view(np.uint8)
            host[o:o + a.size] = a
        self._const_buffer = cuda.to_device(host)
        views = {}
        for s, o in layout.items():
            a = consts[s]
            n = int(a.size)
            views[s] = (cuda.device_array(0, a.dtype) if n == 0
                        else self._const_buffer[o:o + n * a.dtype.itemsize].view(a.dtype))
        return views

    # -- introspection ------------------------------------------------------------------
    @property
    def library(self):
        """The kernel library (``codegen.cuda.jit.CudaLibrary``)."""
        return self._lib

    @property
    def cuda_sources(self) -> dict[str, str]:
        """Kernel name -> the numba.cuda Python source it was compiled from."""
        return dict(getattr(self._lib, "sources", {}) or {})

    @property
    def arena_bytes(self) -> int:
        """Device bytes of one arena (intermediates at the plan's offsets, then inputs, outputs
        and the status word)."""
        return self._arena_bytes

    def can_save(self) -> bool:
        return hasattr(self._lib, "to_blob")

    @property
    def num_threads(self) -> int:
        """Always 1: the kernels run on the GPU, and one host thread launches them (the CPU
        module's setting; setting it checks the value, ValueError below 1, and changes nothing)."""
        return 1

    @num_threads.setter
    def num_threads(self, n) -> None:
        from .threads import resolve_num_threads
        resolve_num_threads(n)

    # -- inputs -------------------------------------------------------------------------
    def _check_input(self, info: TensorInfo, a):
        """A numpy (or array-like) input as the CPU module checks it; a device array (numba's,
        or anything with ``__cuda_array_interface__``) checked from its interface and returned
        as a flat device array over the same memory (no copy). Raises ValueError naming the
        input for a wrong dtype or shape, and for a device array that is not C-contiguous or
        has a mask."""
        if isinstance(a, np.ndarray) or not _is_device_array(a):
            return super()._check_input(info, a)
        iface = _interface(a)
        dtype = np.dtype(iface["typestr"])
        shape = tuple(int(d) for d in iface["shape"])
        if dtype != info.dtype:
            raise ValueError(f"input '{info.name}': expected dtype {info.dtype}, got {dtype} (a device array)")
        if shape != info.shape:
            raise ValueError(f"input '{info.name}': expected shape {list(info.shape)}, got {list(shape)} "
                             f"(a device array)")
        strides = iface.get("strides")
        if strides is not None:
            want, acc = [], dtype.itemsize
            for d in reversed(shape):
                want.append(acc)
                acc *= d
            if any(d > 1 and st != w for d, st, w in zip(shape, tuple(strides), reversed(want))):
                raise ValueError(f"input '{info.name}': a device array must be C-contiguous, got strides "
                                 f"{list(strides)} for shape {list(shape)} (make a contiguous copy on the device)")
        if iface.get("mask") is not None:
            raise ValueError(f"input '{info.name}': masked device arrays are not supported")
        stream = iface.get("stream")
        if stream not in (None, 1, 2):          # produced on another stream: wait for it
            self._cuda.synchronize()
        numel = int(np.prod(shape, dtype=np.int64))
        return _as_flat_device(self._cuda, a, iface, numel, dtype)

    # -- running ------------------------------------------------------------------------
    def _acquire(self) -> _CudaArena:
        with self._pool_lock:
            if self._pool:
                return self._pool.pop()
        return _CudaArena(self)

    def _release(self, arena: _CudaArena) -> None:
        with self._pool_lock:
            self._pool.append(arena)

    def _bind(self, arena: _CudaArena, inputs, return_device: bool) -> dict[int, object]:
        """slot -> the device array each kernel parameter gets for this run: numpy inputs
        copied into their views, device inputs bound as they are, outputs in the arena (or in
        fresh device arrays with ``return_device``); the status word zeroed."""
        prog, cuda = self._program, self._cuda
        args = dict(arena.views)
        for s, a in zip(prog.inputs, inputs):
            if isinstance(a, np.ndarray):
                if a.size:
                    args[s].copy_to_device(a.reshape(-1))
            else:
                args[s] = a
        if return_device:
            for s in prog.outputs:
                info = prog.slots[s]
                args[s] = cuda.device_array(int(np.prod(info.shape, dtype=np.int64)), info.dtype)
        if prog.status_slot is not None:
            args[prog.status_slot].copy_to_device(np.zeros(2, np.int64))
        for s, r in self.memory_plan.aliases.items():       # a reshape views its root's flat array
            args[s] = args[r]
        return args

    def _launch_all(self, args: dict[int, object]) -> None:
        lib = self._lib
        if self._simulated:
            with _SIM_LAUNCH_LOCK:
                for c in self._program.calls:
                    lib.launch(c.kernel, [args[s] for s in c.slots])
            return
        for c in self._program.calls:
            lib.launch(c.kernel, [args[s] for s in c.slots])

    def _finish(self, args: dict[int, object], return_device: bool) -> list:
        """After the launches: synchronize, check the status word, and the outputs."""
        prog = self._program
        self._cuda.synchronize()
        if prog.status_slot is not None:
            code, value = (int(v) for v in args[prog.status_slot].copy_to_host())
            if code:
                raise RunCheckError(f"{prog.messages[code - 1]}: got {value}")
        outs = []
        for s, info in zip(prog.outputs, self.output_info):
            dev = args[s]
            if return_device:
                outs.append(dev.reshape(info.shape) if dev.size else dev)
            else:
                out = np.empty(info.shape, info.dtype)
                if out.size:
                    dev.copy_to_host(out.reshape(-1))
                outs.append(out)
        return outs

    def run(self, *arrays, return_device: bool = False, **named) -> list:
        """Run the model on the GPU. Inputs by position (graph input order) or by name: numpy
        arrays (or array-likes) of each input's dtype and shape, copied to the device, or
        device arrays (numba device arrays, or objects with ``__cuda_array_interface__`` such
        as CuPy arrays and PyTorch CUDA tensors) used in place with no host copy. Returns the
        outputs in graph output order: fresh numpy arrays, after ``cuda.synchronize()``; with
        ``return_device=True``, fresh numba device arrays of the outputs' shapes (the device
        is synchronized too, so they are ready). Safe to call from several threads at once
        (each run in flight has its own arena; under the simulator, launches are serialised).

        Raises ValueError for a missing, unknown or repeated input, a wrong dtype or shape
        (naming the input, expected and got), a non-contiguous device array, or a failed
        run-time check (the check's message and the offending value); RuntimeError when the
        GPU is gone.

        A model input that is itself called ``return_device`` is passed by that keyword as
        any other input: a value that is not a Python or numpy bool is that input, not the flag."""
        if "return_device" in self.input_names and not isinstance(return_device, (bool, np.bool_)):
            named = {**named, "return_device": return_device}
            return_device = False
        inputs = self._check_inputs(arrays, named)
        arena = self._acquire()
        try:
            args = self._bind(arena, inputs, return_device)
            self._launch_all(args)
            return self._finish(args, return_device)
        finally:
            self._release(arena)

    __call__ = run

    # -- measuring ----------------------------------------------------------------------
    def benchmark(self, *arrays, repeat: int = 20, warmup: int = 2, return_device: bool = False, **named):
        """Median, min and max wall time (ms) of whole ``run()`` calls (inputs copied in or
        bound, every launch, the synchronize and the outputs copied out, or left on the device
        with ``return_device``) over ``repeat`` runs after ``warmup`` runs (a
        :class:`~runtime.profile.Benchmark`). Inputs as for :meth:`run`, checked once first
        (ValueError)."""
        from .profile import time_calls
        self._check_inputs(arrays, named)
        return time_calls(lambda: self.run(*arrays, return_device=return_device, **named), repeat, warmup)

    def profile(self, *arrays, repeat: int = 10, warmup: int = 1, show: bool = False, **named):
        """Time every kernel call on its own, in run order (each sees the data of a real run),
        ``repeat`` times after ``warmup`` runs. On a GPU each call is timed with CUDA events
        (``cuda.event(timing=True)`` before and after its launches, read after the event
        synchronizes: device time). Under the CUDA simulator events record no time, so each
        call is timed on the host instead (``cuda.synchronize()``, wall clock around the
        launch and a second synchronize); ``Profile.clock`` says which ("cuda events" or
        "host"). Returns a :class:`~runtime.profile.Profile` (the table of
        ``CPU Module.profile``). Inputs as for :meth:`run`; raises ValueError for bad inputs or
        repeat < 1."""
        from .profile import _check_repeat, make_profile
        _check_repeat(repeat)
        cuda = self._cuda
        inputs = self._check_inputs(arrays, named)
        calls = self._program.calls
        lib = self._lib
        events = not self._simulated
        arena = self._acquire()
        sim_lock = _SIM_LAUNCH_LOCK if self._simulated else None
        if sim_lock is not None:
            sim_lock.acquire()
        try:
            args = self._bind(arena, inputs, False)
            launches = [(c.kernel, [args[s] for s in c.slots]) for c in calls]
            for _ in range(warmup):
                for name, a in launches:
                    lib.launch(name, a)
            cuda.synchronize()
            times = [[0.0] * repeat for _ in calls]
            for r in range(repeat):
                for k, (name, a) in enumerate(launches):
                    if events:
                        e0, e1 = cuda.event(timing=True), cuda.event(timing=True)
                        e0.record()
                        lib.launch(name, a)
                        e1.record()
                        e1.synchronize()
                        times[k][r] = cuda.event_elapsed_time(e0, e1) * 1e-3
                    else:
                        cuda.synchronize()
                        t0 = time.perf_counter()
                        lib.launch(name, a)
                        cuda.synchronize()
                        times[k][r] = time.perf_counter() - t0
        finally:
            if sim_lock is not None:
                sim_lock.release()
            self._release(arena)
        med = [statistics.median(t) * 1e3 for t in times]
        return make_profile(self, med, repeat, warmup, show, clock="cuda events" if events else "host")
