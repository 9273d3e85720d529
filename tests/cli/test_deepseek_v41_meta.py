"""The existing system's real DeepSeek V4.1 meta (tp 1, ep 8: tests/fixtures/foreign/deepseek_v41)
passes verify as a bare file, with a definite statement about its gradients, without torch."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

META = Path(__file__).resolve().parents[1] / "fixtures" / "foreign" / "deepseek_v41" / \
    "codegen_meta.json"


def test_the_real_deepseek_v41_meta_passes_bare_with_a_gradient_statement() -> None:
    code = (
        "import json, sys\n"
        "from hpcodegen.__main__ import main\n"
        f"sys.argv = ['hpcodegen', 'verify', '--json', '-v', {str(META)!r}]\n"
        "try:\n    rc = main()\nexcept SystemExit as e:\n    rc = e.code\n"
        "print('TORCH', 'torch' in sys.modules, 'RC', rc, file=sys.stderr)\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=300, check=False)
    assert "TORCH False RC 0" in proc.stderr, proc.stderr[-2000:]
    doc = json.loads(proc.stdout)
    findings = doc["findings"]
    codes = {f["code"] for f in findings}
    assert not [f for f in findings if f["severity"] == "error"], findings[:3]
    assert "plan.tp_one_grads_whole" in codes, sorted(codes)
    # the expert-parallel factories of that system are named, never imported
    assert "plan.foreign_system_target" in codes
