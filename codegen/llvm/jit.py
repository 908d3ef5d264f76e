"""LLVM IR -> machine code for the host CPU (llvmlite 0.45+: new pass builder, opaque pointers).

One target machine is made from the host triple, CPU name and features. ``compile_ir`` parses
and verifies the module text, optimises it (O3 by default) and returns a :class:`NativeLibrary`
holding an MCJIT engine and function addresses. ``STATS["codegen_calls"]`` counts code
generations, so tests can assert that loading a saved artifact generated no code.
"""
from __future__ import annotations

import functools

import llvmlite.binding as llvm

STATS = {"codegen_calls": 0}


class LLVMError(RuntimeError):
    """LLVM rejected the generated IR: a tensorfuse bug; the message names the module."""


@functools.lru_cache(maxsize=None)
def _init() -> None:
    llvm.initialize_native_target()
    llvm.initialize_native_asmprinter()


@functools.lru_cache(maxsize=None)
def target_machine(opt: int = 3):
    """The host target machine (triple, CPU name, features), cached for optimisation and
    object emission. An execution engine takes ownership of its target machine, so engines
    get a fresh one from :func:`_new_target_machine`."""
    return _new_target_machine(opt)


def _new_target_machine(opt: int = 3):
    _init()
    target = llvm.Target.from_triple(llvm.get_process_triple())
    return target.create_target_machine(cpu=llvm.get_host_cpu_name(),
                                        features=llvm.get_host_cpu_features().flatten(),
                                        opt=opt, reloc="pic", codemodel="jitdefault")


def host_info() -> dict:
    """Triple, CPU name and feature string of this machine (recorded in saved artifacts)."""
    _init()
    return {"triple": llvm.get_process_triple(), "cpu": llvm.get_host_cpu_name(),
            "features": llvm.get_host_cpu_features().flatten()}


def optimize(mod, opt: int = 3) -> None:
    tm = target_machine(opt)
    pto = llvm.create_pipeline_tuning_options(speed_level=opt)
    pto.loop_vectorization = opt >= 2
    pto.slp_vectorization = opt >= 2
    pb = llvm.create_pass_builder(tm, pto)
    pb.getModulePassManager().run(mod, pb)


class NativeLibrary:
    """Machine code loaded in this process; keeps the engine alive while addresses are used."""

    def __init__(self, engine, mod=None):
        self._engine = engine
        self._mod = mod

    def address(self, name: str) -> int:
        addr = self._engine.get_function_address(name)
        if not addr:
            raise LLVMError(f"symbol {name} not found in compiled module")
        return addr


def parse_and_verify(ir_text: str, name: str = "module"):
    _init()
    try:
        mod = llvm.parse_assembly(ir_text)
        mod.name = name
        mod.verify()
    except RuntimeError as e:
        raise LLVMError(f"LLVM rejected the IR of {name}: {e}") from None
    return mod


def compile_ir(ir_text: str, name: str = "module", opt: int = 3):
    """Compile LLVM IR text; returns (NativeLibrary, object_code bytes, optimized IR text)."""
    STATS["codegen_calls"] += 1
    mod = parse_and_verify(ir_text, name)
    optimize(mod, opt)
    tm = target_machine(opt)
    obj = tm.emit_object(mod)
    return load_object(obj), obj, str(mod)


def load_object(obj: bytes) -> NativeLibrary:
    """Link previously emitted object code into this process without generating code."""
    tm = _new_target_machine(3)
    engine = llvm.create_mcjit_compiler(llvm.parse_assembly(""), tm)
    engine.add_object_file(llvm.ObjectFileRef.from_data(obj))
    engine.finalize_object()
    return NativeLibrary(engine)
