"""Import a generated modeling module as a synthetic package (no ``sys.path`` edits).

The module is named ``hpcodegen_generated.<safe dirname>_<sha256(absdir)[:12]>.<stem>``: the
same directory always maps to the same name, two artifacts with the same directory name never
collide, and sibling files are importable as ``<package>.<sibling>`` through the package's
``__path__``. Imports are cached per directory (and re-done when the file's digest changed);
a failed import leaves nothing behind in ``sys.modules``.
"""

from __future__ import annotations

import hashlib
import importlib.util
import re
import sys
import types
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from hpcodegen.artifact.load import LoadedMeta
from hpcodegen.checks.files import MODELING_GLOB, modeling_files
from hpcodegen.errors import PlanError, error
from hpcodegen.targets import check_targets

ROOT_PACKAGE = "hpcodegen_generated"
_CACHE: dict[str, tuple[str, types.ModuleType]] = {}


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


def _ensure_package(name: str, path: list[str]) -> tuple[types.ModuleType, bool]:
    existing = sys.modules.get(name)
    if existing is not None:
        return existing, False
    module = types.ModuleType(name, "hpcodegen synthetic package for generated code")
    module.__path__ = path
    module.__package__ = name
    sys.modules[name] = module
    return module, True


def import_generated_module(artifact_dir: str | Path, digest: str = "") -> types.ModuleType:
    """Import (or return the cached) generated module of ``artifact_dir``.

    Args:
        artifact_dir: the artifact directory.
        digest: the modeling file's sha256 as checked; a different digest re-imports.

    Raises:
        PlanError: no single modeling file, or executing it failed (the error is named).
    """
    absdir = Path(artifact_dir).resolve()
    path = find_modeling_file(absdir)
    cached = _CACHE.get(str(absdir))
    if cached is not None and cached[0] == digest and sys.modules.get(cached[1].__name__):
        return cached[1]
    pkg = package_name(absdir)
    _, root_new = _ensure_package(ROOT_PACKAGE, [])
    _, pkg_new = _ensure_package(pkg, [str(absdir)])
    name = f"{pkg}.{path.stem}"
    sys.modules.pop(name, None)
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    module.__package__ = pkg
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except Exception as exc:
        for stale in [n for n in sys.modules if n == name or (pkg_new and n.startswith(pkg))]:
            sys.modules.pop(stale, None)
        if root_new and not any(n.startswith(ROOT_PACKAGE + ".") for n in sys.modules):
            sys.modules.pop(ROOT_PACKAGE, None)
        _CACHE.pop(str(absdir), None)
        raise PlanError([error("runtime.import_failed", path.name,
                               f"importing the generated module failed: "
                               f"{type(exc).__name__}: {exc}", file=str(path))]) from exc
    _CACHE[str(absdir)] = (digest, module)
    return module


def import_verified_module(loaded: LoadedMeta,
                           allowed_target_prefixes: tuple[str, ...] = ()) -> types.ModuleType:
    """:func:`import_generated_module` for a meta that passed verify's checks.

    Keyed by the modeling file's recorded sha256 (``outputs.modeling.sha256``), as
    ``parallelize_from_generated`` keys it, so a model class taken from this module and the
    install later share one import.

    Example::

        loaded = load_verified_meta("examples/llama_tp2")
        cls = generated_model_class(loaded.data, import_verified_module(loaded))
    """
    check_targets(loaded.data, allowed_target_prefixes)
    outputs = loaded.data.get("outputs") or {}
    digest = (outputs.get("modeling") or {}).get("sha256", "")
    return import_generated_module(loaded.artifact_dir, digest)


def generated_model_class(meta: Mapping[str, Any], module: types.ModuleType) -> type:
    """The class named by ``meta.model_class`` (else ``source.architecture``) in the module."""
    name = meta.get("model_class") or (meta.get("source") or {}).get("architecture")
    cls = getattr(module, name, None) if isinstance(name, str) else None
    if not isinstance(cls, type):
        classes = sorted(n for n, v in vars(module).items()
                         if isinstance(v, type) and v.__module__ == module.__name__)
        raise PlanError([error("runtime.model_class", "/model_class",
                               f"the generated module has no class {name!r}",
                               expected=", ".join(classes) or "a model class")])
    return cls
