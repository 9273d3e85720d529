"""The gate on a big plan stays pure: ``verify`` (no ``--hf-config``) and ``inspect-plan``
of a 10,000-entry artifact import neither torch nor transformers, nor jsonschema for a
meta the schema accepts (its one-sided validator decides), and a passing ``verify``
piped to a file prints without rich. Speed itself is bench/gate_speed.py's (no timing
here)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "bench"))
from synthetic import write_synthetic  # noqa: E402

#: Runs one verb in a fresh process, then names the heavy packages it loaded (stderr).
_PROBE = textwrap.dedent("""
    import sys
    from hpcodegen.cli.app import main
    try:
        main(sys.argv[1:])
    except SystemExit as exc:
        code = exc.code
    heavy = {"torch", "transformers", "jsonschema", "referencing", "rich"}
    print("PROBE", code, ",".join(sorted(heavy & {m.split(".")[0] for m in sys.modules})),
          file=sys.stderr)
""")


@pytest.fixture(scope="module")
def big_artifact(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_synthetic(tmp_path_factory.mktemp("gate") / "big", 10_000)


def _loaded(*argv: str) -> tuple[int, set[str], str]:
    env = {k: v for k, v in os.environ.items() if k not in ("FORCE_COLOR", "TTY_COMPATIBLE")}
    proc = subprocess.run([sys.executable, "-c", _PROBE, *argv], capture_output=True,
                          text=True, env=env, timeout=300)
    line = next(x for x in proc.stderr.splitlines() if x.startswith("PROBE"))
    _, code, names = [*line.split(" "), ""][:3]
    return int(code), set(filter(None, names.split(","))), proc.stdout


@pytest.mark.timeout(600)
def test_verify_of_a_big_plan_imports_no_torch_no_jsonschema_no_rich(big_artifact: Path) -> None:
    code, loaded, out = _loaded("verify", str(big_artifact))
    assert code == 0, out
    assert out.splitlines()[0].startswith(f"PASS {big_artifact}: 5 passed")
    assert loaded == set(), loaded


@pytest.mark.timeout(600)
def test_inspect_plan_of_a_big_plan_imports_no_torch_no_jsonschema(big_artifact: Path) -> None:
    code, loaded, out = _loaded("inspect-plan", str(big_artifact))
    assert code == 0, out
    assert "model.layers.{0..2498}.self_attn x2499" in out  # the layers folded into one row
    assert loaded <= {"rich"}, loaded  # its tables are rich's
