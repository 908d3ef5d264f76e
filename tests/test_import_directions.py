"""Import directions between tensorfuse's sub-packages (issue 20): ``ir`` imports nothing of
``compiler``, ``codegen`` or ``runtime``; ``codegen`` and ``runtime`` import nothing of
``compiler``. The shared low-level types (``ir.target.Target``, the error classes in
``ir.errors``, the compile report in ``ir.report``) live low enough for that.

Every ``.py`` of the package is parsed (not imported) and every import in it is resolved to a
``tensorfuse`` module: ``import``/``from ... import`` at module level, inside functions and
under ``TYPE_CHECKING``, relative ones from the file's own package, ``from tensorfuse import X``
through the root's lazy name table (``tensorfuse._API``), and string literals naming a tensorfuse
module (``importlib.import_module("tensorfuse.compiler.x")`` and tables of such names that are
imported later).
"""
from __future__ import annotations

import ast
import pathlib
import re

import tensorfuse

ROOT = pathlib.Path(__file__).resolve().parent.parent
SUBPACKAGES = ("compiler", "runtime", "ir", "codegen")

#: the root's modules that every layer may import; they import nothing of tensorfuse themselves
#: (the package root ``tensorfuse`` imports its API lazily, by name: see :func:`imports_in`)
BASE_MODULES = ("tensorfuse.debug", "tensorfuse.progress")

#: layer -> the layers it must not import ("api": the root's other modules, such as
#: ``tensorfuse.backend`` and ``tensorfuse.testing``, which import the compiler)
FORBIDDEN = {
    "ir": {"compiler", "codegen", "runtime", "api"},
    "codegen": {"compiler", "api"},
    "runtime": {"compiler", "api"},
    "base": {"compiler", "codegen", "runtime", "ir", "api", "root"},
}

_MODULE_NAME = re.compile(r"tensorfuse(\.[A-Za-z_]\w*)+")


def package_files() -> list[pathlib.Path]:
    """The package's own modules: the root's ``*.py`` and every ``.py`` under the sub-packages."""
    files = sorted(ROOT.glob("*.py"))
    for sub in SUBPACKAGES:
        files += sorted((ROOT / sub).rglob("*.py"))
    return files


def module_name(path: pathlib.Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(["tensorfuse", *parts])


def _is_module(name: str) -> bool:
    """Whether ``tensorfuse.a.b`` names a module or package of this tree."""
    rel = name.split(".")[1:]
    if not rel:
        return True
    base = ROOT.joinpath(*rel)
    return base.with_suffix(".py").is_file() or (base / "__init__.py").is_file()


def layer(name: str) -> str | None:
    """The sub-package (``ir``, ``compiler``, ...) a ``tensorfuse.*`` module belongs to;
    ``"root"`` for the package root, ``"base"`` for :data:`BASE_MODULES`, ``"api"`` for the
    root's other modules; ``None`` for anything outside tensorfuse."""
    parts = name.split(".")
    if parts[0] != "tensorfuse":
        return None
    if len(parts) == 1:
        return "root"
    if parts[1] in SUBPACKAGES:
        return parts[1]
    return "base" if ".".join(parts[:2]) in BASE_MODULES else "api"


def imports_of(path: pathlib.Path) -> list[tuple[int, str, str]]:
    """(line, the import as written, the tensorfuse module it loads) for every import in ``path``."""
    return imports_in(path.read_text(), module_name(path), path.name == "__init__.py", str(path))


def imports_in(text: str, mod: str, is_package: bool, filename: str = "<probe>") -> list[tuple[int, str, str]]:
    """:func:`imports_of` for the source ``text`` of module ``mod`` (a package's ``__init__``
    when ``is_package``, which is what relative imports count from)."""
    package = mod if is_package else mod.rpartition(".")[0]
    tree = ast.parse(text, filename)
    found: list[tuple[int, str, str]] = []
    binds_root = False            # ``import tensorfuse``: then ``tensorfuse.X`` is a lazy import

    def add(node: ast.AST, name: str) -> None:
        entry = (node.lineno, ast.get_source_segment(text, node) or name, name)
        if layer(name) is not None and entry not in found:
            found.append(entry)

    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                add(node, alias.name)
                if alias.name == "tensorfuse" and alias.asname is None:
                    binds_root = True
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                if node.level > 1:
                    base = base[:-(node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            for alias in node.names:
                sub = f"{target}.{alias.name}"
                if alias.name != "*" and _is_module(sub):
                    add(node, sub)                            # from pkg import submodule
                elif target == "tensorfuse" and alias.name in tensorfuse._API:
                    add(node, tensorfuse._API[alias.name][0])  # from tensorfuse import compile
                else:
                    add(node, target)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            if _MODULE_NAME.fullmatch(node.value) and _is_module(node.value):
                add(node, node.value)                         # importlib.import_module("tensorfuse.x")
    if binds_root:
        for node in ast.walk(tree):
            if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
                    and node.value.id == "tensorfuse"):
                name = f"tensorfuse.{node.attr}"
                if _is_module(name):
                    add(node, name)
                elif node.attr in tensorfuse._API:
                    add(node, tensorfuse._API[node.attr][0])
    return found


def wrong_way_imports() -> list[str]:
    bad = []
    for path in package_files():
        own = layer(module_name(path))
        forbidden = FORBIDDEN.get(own, set())
        for line, text, name in imports_of(path):
            if layer(name) in forbidden:
                bad.append(f"{path.relative_to(ROOT)}:{line}: {own} imports {layer(name)}: "
                           f"{' '.join(text.split())}  ({name})")
    return bad


def test_the_walk_sees_every_kind_of_import():
    """The resolver on a made-up module of ``ir``: relative, absolute, inside a function, a lazy
    root name and a string literal each resolve to the module they load."""
    text = ("from ..compiler import errors\n"
            "from .. import runtime\n"
            "from . import types\n"
            "def f():\n"
            "    from tensorfuse.codegen.base import Backend\n"
            "    import importlib\n"
            "    return importlib.import_module('tensorfuse.compiler.driver')\n"
            "from tensorfuse import compile\n"
            "import tensorfuse\n"
            "tensorfuse.explain\n")
    got = sorted((line, name) for line, _, name in imports_in(text, "tensorfuse.ir.probe", False))
    assert got == [(1, "tensorfuse.compiler.errors"), (2, "tensorfuse.runtime"), (3, "tensorfuse.ir.types"),
                   (5, "tensorfuse.codegen.base"), (7, "tensorfuse.compiler.driver"),
                   (8, "tensorfuse.compiler.driver"), (9, "tensorfuse"), (10, "tensorfuse.compiler.explain")]
    # from a package's __init__, one dot is the package itself
    got = [name for _, _, name in imports_in("from .knobs import knob\n", "tensorfuse.ir", True)]
    assert got == ["tensorfuse.ir.knobs"]


def test_imports_go_one_way():
    bad = wrong_way_imports()
    assert not bad, ("imports against the direction ir <- codegen/runtime <- compiler "
                     f"({len(bad)}):\n" + "\n".join(bad))
