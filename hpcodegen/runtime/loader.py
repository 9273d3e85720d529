"""Execute an artifact's generated code from exactly the bytes that were checked.

Each recorded ``.py`` output (the modeling file, and sibling modules such as a remote
``configuration_*.py``) is read once through :func:`hpcodegen.checks.files.read_recorded`
(no escaping name or link), its sha256 compared with the one ``outputs`` records, and those
same bytes are compiled and executed. Nothing goes through the path-based import system: no
``__pycache__`` is consulted or written, and a file changed after the check cannot run.

The modules live in a synthetic package ``hpcodegen_generated.<dirname>_<sha256(absdir)[:12]>``
whose ``__path__`` is empty; an :class:`ArtifactFinder` on ``sys.meta_path`` serves its
modules from the in-memory map and refuses any other name under it (an unrecorded sibling
cannot be imported). Imports are cached per directory and recorded digests; a failed import
leaves nothing behind in ``sys.modules``. Injection targets are checked against the registry
(:mod:`hpcodegen.targets`) before any artifact byte runs.
"""

from __future__ import annotations

import hashlib
import importlib.abc
import importlib.machinery
import linecache
import os
import re
import sys
import types
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hpcodegen.artifact.load import LoadedMeta
from hpcodegen.checks.files import (
    INIT_NAME,
    MODELING_GLOB,
    RecordedFileError,
    modeling_files,
    read_recorded,
    role_file_name,
)
from hpcodegen.errors import PlanError, error, pointer
from hpcodegen.plan.codec import as_plan
from hpcodegen.plan.types import Plan
from hpcodegen.targets import check_targets

ROOT_PACKAGE = "hpcodegen_generated"


@dataclass(frozen=True)
class _Source:
    """One checked module: where it was read from and the exact bytes that run."""

    path: Path
    data: bytes


class ArtifactFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Serves the synthetic packages' modules from checked bytes; refuses anything else."""

    def __init__(self) -> None:
        self.sources: dict[str, _Source] = {}
        self.packages: set[str] = set()

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        source = self.sources.get(fullname)
        if source is not None:
            spec = importlib.machinery.ModuleSpec(fullname, self, origin=str(source.path))
            spec.has_location = True
            return spec
        package = fullname.rpartition(".")[0]
        if package in self.packages:
            raise ModuleNotFoundError(
                f"{fullname!r} is not a recorded, hashed output of the artifact: only the "
                "files meta.outputs records (and their sha256 matches) are importable",
                name=fullname)
        return None

    def create_module(self, spec: Any) -> None:
        return None

    def exec_module(self, module: types.ModuleType) -> None:
        source = self.sources[module.__name__]
        module.__cached__ = None  # type: ignore[attr-defined]
        code = compile(source.data, str(source.path), "exec", dont_inherit=True)
        exec(code, module.__dict__)

    def get_source(self, fullname: str) -> str:
        """The executed text (``inspect.getsource`` and tracebacks show what ran)."""
        return self.sources[fullname].data.decode("utf-8")


_FINDER = ArtifactFinder()
_CACHE: dict[str, tuple[tuple[tuple[str, str], ...], types.ModuleType]] = {}


def _install_finder() -> None:
    if _FINDER not in sys.meta_path:
        sys.meta_path.insert(0, _FINDER)


def find_modeling_file(artifact_dir: Path) -> Path:
    """The one ``modeling_*_gen_npu.py`` of the artifact; PlanError for none or several.

    Found by verify's own rule (:func:`hpcodegen.checks.files.modeling_files`), so the file
    imported is the file the ``outputs`` and ``source`` checks read.
    """
    found = modeling_files(Path(artifact_dir))
    if len(found) != 1:
        what = "no" if not found else f"{len(found)}"
        raise PlanError([error("runtime.modeling_file", str(artifact_dir),
                               f"{what} generated modeling files ({MODELING_GLOB})",
                               expected="exactly one", hint="run `hpcodegen generate` again")])
    return found[0]


def package_name(artifact_dir: Path) -> str:
    absdir = str(Path(artifact_dir).resolve())
    safe = re.sub(r"[^0-9A-Za-z_]", "_", Path(absdir).name) or "artifact"
    return f"{ROOT_PACKAGE}.{safe}_{hashlib.sha256(absdir.encode()).hexdigest()[:12]}"


def _recorded_modules(outputs: Mapping[str, Any], modeling: Path
                      ) -> list[tuple[str, str, str]]:
    """``(outputs key, file name, recorded sha256)`` of every recorded importable module:
    top-level ``*.py`` outputs with an identifier stem (``__init__.py`` is not executed)."""
    out = []
    for key, record in outputs.items():
        name = role_file_name(key, modeling)
        if name is None or name == INIT_NAME or "/" in name or not name.endswith(".py"):
            continue
        if not name[:-3].isidentifier():
            continue
        digest = record.get("sha256") if isinstance(record, Mapping) else None
        out.append((key, name, digest if isinstance(digest, str) else ""))
    return out


def _read_checked(artifact_dir: Path, key: str, name: str, digest: str) -> _Source:
    """Read ``name`` once and compare those bytes with the recorded sha256."""
    where = pointer("outputs", key)
    try:
        data = read_recorded(artifact_dir, name)
    except RecordedFileError as exc:
        raise PlanError([error(f"outputs.{exc.rule}", where, str(exc),
                               file=str(artifact_dir / name))]) from None
    actual = hashlib.sha256(data).hexdigest()
    if actual != digest:
        raise PlanError([error("outputs.sha256_drift", pointer("outputs", key, "sha256"),
                               f"{name} changed since it was checked: recorded sha256 "
                               f"{digest or '(none)'}, read {actual}; nothing was executed",
                               expected=digest or "a recorded sha256",
                               file=str(artifact_dir / name),
                               hint="regenerate the artifact, or restore the file")])
    return _Source(artifact_dir / name, data)


def _forget(pkg: str) -> None:
    for name in [n for n in sys.modules if n == pkg or n.startswith(pkg + ".")]:
        sys.modules.pop(name, None)
    for name in [n for n in _FINDER.sources if n.startswith(pkg + ".")]:
        _FINDER.sources.pop(name, None)
    _FINDER.packages.discard(pkg)


def _synthetic_package(name: str) -> types.ModuleType:
    module = sys.modules.get(name)
    if module is None:
        module = types.ModuleType(name, "hpcodegen synthetic package for generated code")
        module.__path__ = []  # never searched: the finder serves the checked modules
        module.__package__ = name
        sys.modules[name] = module
    _FINDER.packages.add(name)
    return module


def import_verified_module(loaded: LoadedMeta, *,
                           allowed_target_prefixes: Sequence[str] = ()) -> types.ModuleType:
    """Import (or return the cached) generated module of a checked meta.

    Injection targets are checked first (:func:`hpcodegen.targets.check_targets`); then
    every recorded module is read once, compared with its recorded sha256 (``meta.outputs``)
    and executed from those bytes. Keyed by the recorded digests, as
    ``parallelize_from_generated`` keys it, so a model class taken from this module and the
    install later share one import.

    Raises:
        PlanError: a foreign target, no single modeling file, a recorded module missing,
            unsafe or changed (``outputs.*``), or executing it failed
            (``runtime.import_failed``, the error named).

    Example::

        art = Artifact.load("examples/llama_tp2")     # calls this as art.module()
        cls = generated_model_class(art.plan, art.module())
    """
    check_targets(loaded, allowed_target_prefixes)
    absdir = Path(loaded.artifact_dir).resolve()
    modeling = find_modeling_file(absdir)
    outputs = loaded.data.get("outputs")
    outputs = outputs if isinstance(outputs, Mapping) else {}
    modules = _recorded_modules(outputs, modeling)
    if not any(name == modeling.name for _, name, _ in modules):
        raise PlanError([error("outputs.missing_role", pointer("outputs", "modeling"),
                               f"outputs records no sha256 for {modeling.name}: it cannot be "
                               "checked, so it is not executed", file=str(loaded.meta_path))])
    key = tuple(sorted((name, digest) for _, name, digest in modules))
    pkg = package_name(absdir)
    name = f"{pkg}.{modeling.name[:-3]}"
    cached = _CACHE.get(str(absdir))
    if cached is not None and cached[0] == key and sys.modules.get(name) is cached[1]:
        return cached[1]
    sources = {f"{pkg}.{n[:-3]}": _read_checked(absdir, k, n, d) for k, n, d in modules}
    _forget(pkg)
    _CACHE.pop(str(absdir), None)
    _install_finder()
    _synthetic_package(ROOT_PACKAGE)
    _synthetic_package(pkg)
    _FINDER.sources.update(sources)
    for source in sources.values():  # tracebacks and inspect show the bytes that ran
        text = source.data.decode("utf-8", "replace")
        linecache.cache[str(source.path)] = (len(text), None, text.splitlines(True),
                                             str(source.path))
    try:
        module = __import__(name, fromlist=["_"])
    except Exception as exc:
        _forget(pkg)
        raise PlanError([error("runtime.import_failed", modeling.name,
                               f"importing the generated module failed: "
                               f"{type(exc).__name__}: {exc}", file=str(modeling))]) from exc
    _CACHE[str(absdir)] = (key, module)
    return module


def import_generated_module(artifact_dir: str | os.PathLike[str], *,
                            allowed_target_prefixes: Sequence[str] = ()) -> types.ModuleType:
    """The generated module of the artifact at ``artifact_dir``: what
    ``Artifact.load(artifact_dir).module()`` runs (the runtime's checks once,
    :func:`hpcodegen.runtime.checked.load_verified_meta`, then :func:`import_verified_module`)."""
    from hpcodegen.runtime.checked import load_verified_meta

    prefixes = tuple(allowed_target_prefixes)
    loaded = load_verified_meta(artifact_dir, allowed_target_prefixes=prefixes)
    return import_verified_module(loaded, allowed_target_prefixes=prefixes)


def generated_model_class(plan: Plan | Mapping[str, Any], module: types.ModuleType) -> type:
    """The class named by ``model_class`` (else ``source.architecture``) in the module, read
    from the typed plan's provenance (a checked meta dict is parsed to its Plan first: the
    public signature existing callers use).

    ``module`` must come from :func:`import_verified_module` (``Artifact.module()``): a
    module imported any other way is refused.
    """
    if not isinstance(getattr(module, "__spec__", None), importlib.machinery.ModuleSpec) \
            or module.__spec__.loader is not _FINDER:
        raise PlanError([error("runtime.unverified_module", getattr(module, "__name__", "?"),
                               "the module was not imported by hpcodegen's verified loader",
                               hint="use hpcodegen.Artifact.load(dir).model_class()")])
    provenance = as_plan(plan).provenance
    source = provenance.source
    name = provenance.model_class or (source.architecture if source else None)
    cls = getattr(module, name, None) if isinstance(name, str) else None
    if not isinstance(cls, type):
        classes = sorted(n for n, v in vars(module).items()
                         if isinstance(v, type) and v.__module__ == module.__name__)
        raise PlanError([error("runtime.model_class", "/model_class",
                               f"the generated module has no class {name!r}",
                               expected=", ".join(classes) or "a model class")])
    return cls


