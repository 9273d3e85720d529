"""A fresh venv with the built wheel, as a user gets it: the helpers of tests/cli/test_install.py.

Two lanes, each one venv for the whole module:

* ``newest``: no constraints at all, so pip resolves the newest releases the registry serves
  for the core and for ``[runtime]`` (transformers included): the smoke lane that notices a
  new typer, transformers or jsonschema breaking us before a user does.
* ``floor``: every lower bound of ``pyproject.toml`` (core, ``[hub]``, ``[runtime]``) pinned
  exactly, so each declared range is true at both ends.

torch is the user's own build, installed first (the README's rule). The lane does it by
hard-linking the files pip installed for ``torch==2.13.0`` in the dev venv (its ``RECORD``)
into the lane's site-packages, the same bytes pip would unpack from the same wheel, in ~1 s
instead of ~25 s; pip then sees torch installed and resolves its dependencies like any
other. The bytecode the dev venv's runs wrote for those modules so far is linked beside them
(``make venv`` installs without it: each process writes what it imports), so a lane compiles
only the torch modules nothing imported before it. The venvs are made ``--without-pip`` and
filled by the dev venv's pip (``--python``), with ``--no-compile``: the verbs compile only
what they import. That pip is constraints.txt's (``make venv`` installs it first): an
unconstrained resolve reads every wheel of every release of rpds-py, pydantic-core, numpy,
tokenizers... (~25,000 links for the core alone), and pip 23.2 (Python 3.11's ensurepip)
matched each against its ~1000 supported tags one hash at a time: twice the CPU of pip 26
for the same resolution.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import zipfile
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PIP = [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q"]
#: the torch the whole project runs on (Makefile, constraints.txt)
TORCH = "2.13.0"
#: what the core install must never pull in
HEAVY = {"torch", "transformers", "libcst", "safetensors", "pyyaml", "nvidia-cublas-cu12"}
#: what [hub] may add to the core: huggingface_hub itself requires pyyaml
HUB_DEPS = {"pyyaml"}
#: the test's process-free runner (tests/cli/inproc.py), loaded from its file alone
INPROC = Path(__file__).with_name("inproc.py")

#: run by the lane's python (``Lane.run_many``): inproc.py loaded from its file (no folder of
#: the checkout joins ``sys.path``), then each case through ``hpcodegen.cli.app.main``, the
#: console script's function, from the lane's site-packages; a case that raises records its
#: traceback as its stderr. Results go to a file: a verb writing to fd 1 cannot garble them.
_MANY = """
import importlib.util
import json
import sys
import traceback

spec = importlib.util.spec_from_file_location("inproc", sys.argv[1])
inproc = importlib.util.module_from_spec(spec)
spec.loader.exec_module(inproc)
import hpcodegen

runs = {}
for case, argv in json.loads(sys.argv[2]).items():
    try:
        proc = inproc.run(*argv)
        runs[case] = [proc.returncode, proc.stdout, proc.stderr]
    except BaseException:
        runs[case] = [None, "", traceback.format_exc()]
with open(sys.argv[3], "w") as out:
    json.dump({"hpcodegen": hpcodegen.__file__, "runs": runs}, out)
"""


def _isolation() -> list[str]:
    """``--no-build-isolation`` when the dev venv's setuptools meets ``[build-system]``'s
    ``setuptools>=77`` (it builds the same bytes: it writes wheels itself),
    so pip does not install a setuptools into a scratch env first (~4 s of CPU); else
    pip's isolated build."""
    try:
        version = importlib.metadata.version("setuptools")
    except importlib.metadata.PackageNotFoundError:
        return []
    major, minor = (int(p) for p in re.findall(r"\d+", version)[:2])
    return ["--no-build-isolation"] if (major, minor) >= (77, 0) else []


def build_wheel(out: Path, scratch: Path) -> Path:
    """``pip wheel`` of a copy of the checkout (no build/ left behind, no stale build/lib)."""
    src = scratch / "hpcodegen"
    shutil.copytree(ROOT, src, ignore=shutil.ignore_patterns(
        ".venv", ".git", "build", "dist", "*.egg-info", "__pycache__", ".*_cache", "out"))
    subprocess.run([*PIP, "wheel", *_isolation(), "--no-deps", "-w", str(out), str(src)],
                   check=True, timeout=300, capture_output=True)
    (path,) = out.glob("hpcodegen-*.whl")
    return path


def requirements(wheel: Path) -> dict[str, list[str]]:
    """The wheel's ``Requires-Dist`` lines by extra (``""``: the core), as pip reads them."""
    with zipfile.ZipFile(wheel) as zf:
        meta = zf.read(next(n for n in zf.namelist() if n.endswith(".dist-info/METADATA")))
    found: dict[str, list[str]] = {}
    for line in meta.decode().splitlines():
        if line.startswith("Requires-Dist:"):
            req, _, marker = line.removeprefix("Requires-Dist:").partition(";")
            extra = re.search(r"extra\s*==\s*[\"']([^\"']+)", marker)
            found.setdefault(extra[1] if extra else "", []).append(req.strip())
    return found


def floors(wheel: Path) -> dict[str, dict[str, str]]:
    """Extra (``""``: the core) -> distribution -> its lower bound, for the core, ``[hub]`` and
    ``[runtime]`` (each must be a plain ``name>=X``: a range with no floor is not testable)."""
    found: dict[str, dict[str, str]] = {}
    for extra, reqs in requirements(wheel).items():
        if extra not in {"", "hub", "runtime"}:
            continue
        for req in reqs:
            match = re.fullmatch(r"([A-Za-z0-9_.-]+)\s*>=\s*([0-9][0-9A-Za-z.]*)", req)
            assert match, f"the wheel requires {req!r}: no plain '>=' lower bound"
            found.setdefault(extra, {})[match[1].lower()] = match[2]
    return found


def _link(src: Path, dst: Path) -> None:
    """``dst`` as a hard link of ``src`` (a copy on another file system)."""
    dst.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.link(src, dst)
    except FileExistsError:
        pass
    except OSError:  # another file system
        shutil.copy2(src, dst)


@dataclass
class Lane:
    """One fresh venv, filled step by step as a user would: the core, then an extra."""

    name: str
    venv: Path
    wheel: Path

    @classmethod
    def create(cls, name: str, base: Path, wheel: Path) -> Lane:
        venv = base / "venv"
        subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True,
                       timeout=300)
        return cls(name, venv, wheel)

    @property
    def python(self) -> Path:
        return self.venv / "bin" / "python"

    def floors(self, extra: str = "") -> dict[str, str]:
        """What the floor lane pins when installing ``extra``: the core's floors and its own."""
        table = floors(self.wheel)
        return {**table[""], **table.get(extra, {})}

    def install(self, extra: str = "") -> None:
        """``pip install`` of the wheel (with ``[extra]``); the floor lane pins every floor
        of the core and of that extra exactly (each extra's floors hold together with the
        core's; [hub]'s need not with [runtime]'s: transformers brings its own hub)."""
        target = f"{self.wheel}[{extra}]" if extra else str(self.wheel)
        pins: list[str] = []
        if self.name == "floor":
            constraints = self.venv.parent / f"floors-{extra or 'core'}.txt"
            constraints.write_text("".join(f"{d}=={v}\n" for d, v in self.floors(extra).items()))
            pins = ["-c", str(constraints)]
        proc = subprocess.run([*PIP, "--python", str(self.python), "install", "--no-compile",
                               "--only-binary", ":all:", *pins, target], capture_output=True,
                              text=True, timeout=600)
        assert proc.returncode == 0, f"{self.name} lane: pip install {target}:\n{proc.stderr}"

    def installed(self) -> dict[str, str]:
        """Distribution (normalized name) -> version in the lane's site-packages: the
        ``.dist-info`` metadata ``pip list`` reads, read here instead of by a pip process
        (~1 s of CPU each, several per lane)."""
        (site,) = self.venv.glob("lib/python*/site-packages")
        return {re.sub(r"[-_.]+", "-", d.metadata["Name"]).lower(): d.version
                for d in importlib.metadata.distributions(path=[str(site)])}

    def install_torch_first(self) -> None:
        """torch==2.13.0 before the ``[runtime]`` extra, linked from the dev venv (see above)."""
        dist = importlib.metadata.distribution("torch")
        assert dist.version.split("+")[0] == TORCH, dist.version
        src_root = Path(dist.locate_file(""))
        (site,) = self.venv.glob("lib/python*/site-packages")
        for rel in dist.files or ():
            src = src_root / rel
            if rel.parts[0] == ".." or not src.is_file():  # console scripts: not used here
                continue
            _link(src, site / rel)
            if src.suffix == ".py":  # its bytecode, where the dev venv's runs wrote it
                cached = Path(importlib.util.cache_from_source(str(src)))
                if cached.is_file():
                    _link(cached, Path(importlib.util.cache_from_source(str(site / rel))))

    def _env(self, env: dict[str, str] | None) -> dict[str, str]:
        """Bytecode written (the venv was installed without it), nothing from the dev venv
        leaking in through PYTHONPATH, no hub reachable."""
        base = {k: v for k, v in os.environ.items()
                if k not in {"PYTHONDONTWRITEBYTECODE", "PYTHONPATH", "VIRTUAL_ENV"}}
        return {**base, "NO_COLOR": "1", "HF_HUB_OFFLINE": "1", **(env or {})}

    def run(self, *args: str | Path, cwd: Path, timeout: float = 300,
            env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
        """The installed ``hpcodegen`` console script, from ``cwd`` (outside the checkout)."""
        return subprocess.run([str(self.venv / "bin" / "hpcodegen"), *map(str, args)],
                              capture_output=True, text=True, timeout=timeout, cwd=cwd,
                              env=self._env(env))

    def run_many(self, cases: dict[str, list[str | Path]], cwd: Path, timeout: float = 300
                 ) -> dict[str, subprocess.CompletedProcess[str]]:
        """Each case's ``hpcodegen ARGS...`` in one interpreter of the lane's python, from
        ``cwd``, through the function the console script calls (exit code, stdout and stderr
        as the script's process gives them: tests/cli/inproc.py): one interpreter start and
        one import of the package (~0.3 s of CPU each) for the batch instead of per command.
        For commands whose subject is the verb's output in these versions, not the process;
        the installed script itself runs through :meth:`run`. Asserts the package came from
        the lane's site-packages."""
        result = self.venv.parent / "run_many.json"
        argv = {case: [str(a) for a in args] for case, args in cases.items()}
        proc = subprocess.run([str(self.python), "-c", _MANY, str(INPROC), json.dumps(argv),
                               str(result)], capture_output=True, text=True, timeout=timeout,
                              cwd=cwd, env=self._env(None))
        assert proc.returncode == 0, (self.name, proc.stdout[-3000:], proc.stderr[-3000:])
        done = json.loads(result.read_text())
        result.unlink()
        (site,) = self.venv.glob("lib/python*/site-packages")
        assert Path(done["hpcodegen"]).is_relative_to(site), (done["hpcodegen"], site)
        return {case: subprocess.CompletedProcess(["hpcodegen", *argv[case]], code, out, err)
                for case, (code, out, err) in done["runs"].items()}
