"""Bad inputs through the ``hpcodegen`` entry point: the documented exit code, a message
naming the culprit, and never a Python traceback.

The in-process tests of each verb check the findings in detail; this one runs every case as
the user types it, through the function the console script calls (:mod:`inproc`: its exit
code is the process's; an exception escaping it fails the test with its traceback), one
after the other, and only cases that stop before torch or transformers load. The console
script as a process, for each exit code and a usage error, is test_cli_conventions.py's.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import inproc
import pytest

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "llama_tp2"
LLAMA = REPO / "examples" / "configs" / "llama"


def _inputs(root: Path) -> dict[str, Path]:
    """Broken artifacts, configs and recipes, one per way a file can be wrong."""
    paths = {name: root / name for name in ("nometa", "array", "truncated", "garbage",
                                            "wrongtypes", "syntax", "symlink", "drift", "huge",
                                            "emptycfg", "badcfg", "nonart")}
    for p in paths.values():
        p.mkdir()
    meta = (EXAMPLE / "codegen_meta.json").read_text()
    (paths["array"] / "codegen_meta.json").write_text("[1, 2]")
    (paths["truncated"] / "codegen_meta.json").write_text(meta[:300])
    (paths["garbage"] / "codegen_meta.json").write_bytes(bytes(range(256)) * 8)
    with open(paths["huge"] / "codegen_meta.json", "wb") as f:  # sparse: no disk, no time
        f.truncate(100 * 1024 * 1024)
    data = json.loads(meta)
    data["param_plan"]["lm_head"] = [1, 2]
    data["param_plan"]["model.embed_tokens"]["params"] = 5
    (paths["wrongtypes"] / "codegen_meta.json").write_text(json.dumps(data))
    for name, edit in (("syntax", "\ndef (:\n"), ("drift", "\n# edited\n"), ("symlink", None)):
        shutil.rmtree(paths[name])
        shutil.copytree(EXAMPLE, paths[name])
        modeling = next(paths[name].glob("modeling_*_gen_npu.py"))
        if edit is None:
            outside = root / "outside.py"
            modeling.rename(outside)
            modeling.symlink_to(outside)
        else:
            modeling.write_text(modeling.read_text() + edit)
    (paths["badcfg"] / "config.json").write_text('{"a":')
    (paths["nonart"] / "notes.txt").write_text("mine")
    (root / "afile").write_text("x")
    (root / "notyaml.yaml").write_text(": : not yaml [")
    return {**paths, "afile": root / "afile", "notyaml": root / "notyaml.yaml"}


def _cases(p: dict[str, Path]) -> list[tuple[list[str], int, str]]:
    """(arguments, exit code, text the error must contain)."""
    ex, cfg, new = str(EXAMPLE), str(LLAMA), str(p["nonart"].parent / "new_out")
    return [
        (["verify", "/nonexistent/art"], 2, "no such artifact directory"),
        (["verify", str(p["nometa"])], 2, "has no codegen_meta.json"),
        (["verify", str(p["array"])], 2, "top level is a JSON array"),
        (["verify", str(p["truncated"])], 2, "invalid JSON"),
        (["verify", str(p["garbage"])], 2, "not UTF-8"),
        (["verify", str(p["huge"])], 2, "is 104857600 bytes"),
        (["verify", str(p["wrongtypes"])], 1, "/param_plan/lm_head: [1, 2] is not of type"),
        (["verify", str(p["syntax"])], 1, "does not parse"),
        (["verify", str(p["symlink"])], 1, "links outside the artifact"),
        (["verify", str(p["drift"])], 1, "changed since generation"),
        (["verify", ex, "--hf-config", str(p["emptycfg"])], 2, "no HF config found"),
        (["verify", ex, "--hf-config", str(p["badcfg"]), "--only", "signature"], 2,
         "invalid JSON"),
        (["verify", ex, "--only", "bogus"], 2, "unknown check(s): bogus"),
        (["inspect-plan", str(p["garbage"])], 2, "not UTF-8"),
        (["inspect-plan", ex, "--mesh", "tp=x"], 2, "--mesh: cannot read 'tp=x'"),
        (["inspect-plan", ex, "--mesh", "tp=0"], 2, "--mesh: cannot read 'tp=0'"),
        (["inspect-plan", ex, "--hf-config", cfg, "--batch", "-1", "--seq", "4"], 2,
         "--batch -1"),
        (["inspect-plan", ex, "--hf-config", cfg, "--batch", "1", "--seq", "4",
          "--dtype", "fp7"], 2, "unknown dtype 'fp7'"),
        (["generate", "--model", "/nonexistent/m", "--tp", "2", "-o", new], 2,
         "no HF config found"),
        (["generate", "--model", cfg, "--tp", "0", "-o", new], 2, "--tp must be"),
        (["generate", "--model", cfg, "--tp", "2", "--recipe", str(p["notyaml"]),
          "-o", new], 2, "not valid YAML"),
        (["generate", "--model", cfg, "--tp", "2", "-o", str(p["nonart"])], 2,
         "refusing to replace it"),
        (["generate", "--model", cfg, "--tp", "2", "-o", str(p["afile"] / "x")], 2,
         "is a file: it cannot hold x"),
        (["launch", ex, "--nproc", "0"], 2, "--nproc 0"),
        (["launch", ex, "--nproc", "3", "--model-dir", cfg], 2, "world size 3"),
        (["launch", ex, "--nproc", "2", "--model-dir", cfg, "--timeout", "-1"], 2,
         "--timeout -1"),
        (["launch", ex, "--nproc", "2", "--model-dir", cfg, "--log-dir", str(p["afile"])], 2,
         "is not a directory"),
        (["launch", str(p["drift"]), "--nproc", "2", "--model-dir", cfg], 1,
         "changed since generation"),
    ]


def _run(args: list[str]) -> subprocess.CompletedProcess[str]:
    return inproc.run(*args, cwd=REPO, columns=1000)


@pytest.mark.timeout(400)
def test_bad_inputs_exit_codes_messages_and_no_traceback(tmp_path: Path) -> None:
    cases = _cases(_inputs(tmp_path))
    runs = [_run(args) for args, _, _ in cases]
    problems = []
    for (args, code, needle), run in zip(cases, runs, strict=True):
        text = run.stdout + run.stderr
        if "Traceback" in text or run.returncode != code or needle not in text:
            problems.append(f"hpcodegen {' '.join(args)} -> {run.returncode} (want {code}, "
                            f"{needle!r}):\n{text[-600:]}")
    assert not problems, "\n\n".join(problems)


def test_version_option() -> None:
    """`hpcodegen --version`: what a bug report needs first."""
    from hpcodegen.cli.app import app, register_verbs
    from typer.testing import CliRunner

    from hpcodegen import __version__

    register_verbs()
    result = CliRunner().invoke(app, ["--version"])
    assert result.exit_code == 0 and result.output.strip() == f"hpcodegen {__version__}"
