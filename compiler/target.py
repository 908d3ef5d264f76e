"""Targets: what code is generated for. ``Target.parse("llvm")`` or ``Target.parse("cuda")``."""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Target:
    """kind: "llvm" (host CPU, NCHW) or "cuda" (NVIDIA GPU through numba.cuda, NHWC)."""

    kind: str
    options: tuple = field(default=())

    KINDS = ("llvm", "cuda")

    @staticmethod
    def parse(target: "str | Target") -> "Target":
        if isinstance(target, Target):
            return target
        if not isinstance(target, str):
            raise TypeError(f"target must be a string such as 'llvm' or 'cuda', got {type(target).__name__}")
        parts = target.split()
        kind = parts[0] if parts else ""
        if kind not in Target.KINDS:
            raise ValueError(f"unknown target {target!r}; expected one of {', '.join(Target.KINDS)}")
        return Target(kind, tuple(parts[1:]))

    def __str__(self) -> str:
        return " ".join((self.kind,) + self.options)


def cuda_available() -> bool:
    """True when the cuda target can run here: a GPU through numba.cuda, or its simulator
    (NUMBA_ENABLE_CUDASIM=1). The cuda code generator is not part of this release yet."""
    return False
