"""CLI conventions every verb follows (docs/cli.md, docs/json.md): -h, -q/-v, one JSON
envelope (Click usage errors too), COLUMNS folding, a closed pipe, completion, progress.

Output and exit codes are read from the entry point run in this process (``inproc``: no
torch import per command); the installed console script runs as a process where the
process is the point: one command per exit code and usage-error kind, a closed pipe, a
terminal (generate; verify on a terminal runs here, its stderr a pseudo-terminal: the
progress decision is the CLI's isatty check either way), shell completion.
"""

from __future__ import annotations

import json
import os
import pty
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import inproc
import pytest

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "llama_tp2"
CONFIG = ROOT / "examples" / "configs" / "llama"
EXE = Path(sys.executable).with_name("hpcodegen")
def _verbs() -> list[str]:
    """Every registered verb (a verb added later is held to the same conventions)."""
    import typer.main
    from hpcodegen.cli.app import app, register_verbs

    register_verbs()
    return sorted(typer.main.get_command(app).commands)  # type: ignore[attr-defined]


VERBS = _verbs()
ENVELOPE = {"version", "tool", "tool_version", "verb", "status", "exit_code", "findings"}


def _env(**extra: str) -> dict[str, str]:
    env = {**os.environ, "NO_COLOR": "1", **extra}
    env.pop("HPCODEGEN_DEBUG", None)
    return env


def cli(*args: str | Path, columns: int = 80, **kw) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(EXE), *map(str, args)], capture_output=True, text=True,
                          timeout=300, cwd=ROOT, env=_env(COLUMNS=str(columns)), **kw)


def here(*args: str | Path, columns: int = 80) -> subprocess.CompletedProcess[str]:
    """``cli``'s command run in this process (:mod:`inproc`), from the checkout."""
    return inproc.run(*args, cwd=ROOT, columns=columns)


def here_many(commands: list[list[str | Path]], columns: int = 80
              ) -> list[subprocess.CompletedProcess[str]]:
    """``here`` (in this process, from the checkout) over many command lines."""
    return [here(*args, columns=columns) for args in commands]


@pytest.fixture(scope="module")
def broken(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An artifact with a drifted modeling file and an unknown axis (long tmp paths too)."""
    art = tmp_path_factory.mktemp("a_rather_long_directory_name_for_folding") / "llama_tp2"
    shutil.copytree(EXAMPLE, art)
    meta = json.loads((art / "codegen_meta.json").read_text())
    first = next(iter(meta["param_plan"].values()))
    first.setdefault("params", {})["weight"] = {"xp": "S(0)"}
    (art / "codegen_meta.json").write_text(json.dumps(meta))
    with open(next(art.glob("modeling_*_gen_npu.py")), "a") as f:
        f.write("# edited\n")
    return art


@pytest.fixture(scope="module")
def batch(tmp_path_factory: pytest.TempPathFactory, broken: Path):
    """Every slow command once: the tests below read their results. On a terminal (a
    pseudo-terminal is stderr): generate as the console script's process, while the others
    run here; verify here after them (``_here_on_tty``: the same isatty decision, without a
    second interpreter importing torch and transformers, ~6 s of CPU)."""
    from concurrent.futures import ThreadPoolExecutor

    tmp = tmp_path_factory.mktemp("batch")
    jobs = {
        "generate json": (["generate", "--model", CONFIG, "--tp", "2", "-o", tmp / "g",
                           "--json"], 80),
        "generate -v": (["generate", "--model", CONFIG, "--tp", "2", "-o", tmp / "v", "-v"],
                        80),
        "generate -q": (["generate", "--model", CONFIG, "--tp", "2", "-o", tmp / "q", "-q"],
                        80),
        "inspect volume": (["inspect-plan", EXAMPLE, "--hf-config", CONFIG, "--batch", "2",
                            "--seq", "16", "--link-gbps", "100"], 80),
        "verify model piped": (["verify", EXAMPLE, "--hf-config", CONFIG], 80),
    }
    with ThreadPoolExecutor(max_workers=1) as pool:
        tty = pool.submit(_on_tty, ["generate", "--model", str(CONFIG), "--tp", "2", "-o",
                                    str(tmp / "t")], tmp)
        out = {k: here(*args, columns=cols) for k, (args, cols) in jobs.items()}
        out["tty verify"] = _here_on_tty(["verify", str(EXAMPLE), "--hf-config", str(CONFIG)],
                                         tmp)
        out["tty generate"] = tty.result()
    return out


def test_short_help_and_verbosity_flags_on_every_verb() -> None:
    assert {"verify", "inspect-plan", "generate", "launch", "schema"} <= set(VERBS)
    assert cli("-h").returncode == 0
    for verb in VERBS:
        run = here(verb, "-h", columns=200)
        assert run.returncode == 0, (verb, run.stderr)
        assert "Usage" in run.stdout
        for flag in ("--quiet", "-q", "--verbose", "-v", "--json", "-h"):
            assert flag in run.stdout, (verb, flag)


def test_json_envelope_for_every_verb_and_error(tmp_path: Path, broken: Path, batch) -> None:
    commands = {
        "verify ok": ["verify", EXAMPLE, "--json"],
        "verify fail": ["verify", broken, "--json"],
        "inspect": ["inspect-plan", EXAMPLE, "--json"],
        "inspect bad mesh": ["inspect-plan", EXAMPLE, "--mesh", "tp", "--json"],
        "schema": ["schema", "--json"],
        "launch dry": ["launch", EXAMPLE, "--nproc", "2", "--model-dir", CONFIG, "--dry-run",
                       "--json"],
        "launch refused": ["launch", tmp_path / "nope", "--json"],
        "generate refused": ["generate", "--model", tmp_path / "none", "--tp", "2", "-o",
                             tmp_path / "h", "--json"],
        "click unknown option": ["verify", EXAMPLE, "--bogus", "--json"],
        "click missing argument": ["inspect-plan", "--json"],
        "click bad type": ["generate", "--model", CONFIG, "--tp", "two", "-o", "x", "--json"],
        "click unknown verb": ["nope", "--json"],
    }
    #: the console script as a process: each exit code, a usage error and an unknown verb
    processes = {"verify fail", "schema", "click unknown option", "click unknown verb"}
    runs = {name: cli(*args) if name in processes else here(*args)
            for name, args in commands.items()}
    runs["generate"] = batch["generate json"]
    expected = {"verify ok": ("verify", 0), "verify fail": ("verify", 1),
                "inspect": ("inspect-plan", 0), "inspect bad mesh": ("inspect-plan", 2),
                "schema": ("schema", 0), "launch dry": ("launch", 0),
                "launch refused": ("launch", 2), "generate": ("generate", 0),
                "generate refused": ("generate", 2), "click unknown option": ("verify", 2),
                "click missing argument": ("inspect-plan", 2),
                "click bad type": ("generate", 2), "click unknown verb": (None, 2)}
    for name, run in runs.items():
        doc = json.loads(run.stdout)  # exactly one document, nothing else on stdout
        assert set(doc) >= ENVELOPE, name
        verb, code = expected[name]
        assert (doc["verb"], doc["exit_code"], run.returncode) == (verb, code, code), name
        assert doc["status"] == {0: "ok", 1: "fail", 2: "error"}[code], name
        assert "Traceback" not in run.stderr and "╭" not in run.stdout, name
        if code:
            assert doc["findings"] and all(f["message"] for f in doc["findings"]), name
    usage = json.loads(runs["click unknown option"].stdout)["findings"][0]
    assert usage["code"] == "cli.usage" and "--bogus" in usage["message"]
    gen = json.loads(runs["generate"].stdout)
    assert gen["written"] and {f["name"] for f in gen["files"]} >= {"codegen_meta.json"}
    assert json.loads(runs["schema"].stdout)["schema"]["type"] == "object"


#: the characters a rich table's lines start with
TABLE_EDGES = tuple("┏┃┡│└┌├╭╰")


def _overflow_is_one_token(line: str) -> bool:
    """A text line wider than the width holds one token (a path, a pointer) that no line
    could hold with its indent: folding never breaks a token, it overflows instead."""
    return len(line.split()) == 1


def test_lines_fold_at_80_and_never_break_a_token(tmp_path: Path, broken: Path,
                                                   batch) -> None:
    """Every line fits 80 columns, except a line that is one token too long for any line
    and a table whose words cannot fit (it widens instead of cutting a word)."""
    runs = here_many([
        ["-h"], *[[v, "-h"] for v in VERBS],
        ["verify", EXAMPLE], ["verify", EXAMPLE, "-v"], ["verify", broken],
        ["verify", broken, "--hf-config", tmp_path / "missing"],
        ["inspect-plan", EXAMPLE], ["inspect-plan", EXAMPLE, "--expand"],
        ["inspect-plan", ROOT / "examples" / "llama_tp2_sp", "--mesh", "tp=4"],
        ["inspect-plan", EXAMPLE, "--mesh", "tp=3"], ["inspect-plan", broken],
        ["generate", "--model", CONFIG, "--tp", "3", "-o", tmp_path / "g3"],
        ["launch", EXAMPLE, "--nproc", "2", "--model-dir", CONFIG, "--dry-run"],
        ["launch", tmp_path / "no" / "such" / "artifact" / "dir", "--nproc", "2"],
        ["verify", "--bogus"], ["inspect-plan", EXAMPLE, "--mesh", "tp=x"]])
    runs += [batch["inspect volume"], batch["generate -v"], batch["verify model piped"]]
    for run in runs:
        assert "Traceback" not in run.stderr, run.args
        for line in (run.stdout + run.stderr).splitlines():
            if len(line.rstrip()) > 80:  # a centred title pads with spaces
                assert line.lstrip().startswith(TABLE_EDGES) or _overflow_is_one_token(
                    line), (run.args, line)


def test_paths_and_identifiers_stay_whole_at_80(broken: Path) -> None:
    """Piped at 80 columns, every finding's JSON pointer and every boundary FQN appears whole
    in the text (grep finds it in a CI log): verify (a failing, long-pathed artifact, with
    -v), inspect-plan's tables, and an artifact of another model against --hf-config."""
    qwen = ROOT / "examples" / "qwen3_tp2"
    pairs = [(["verify", broken, "-v"], ["verify", broken, "-v", "--json"]),
             (["verify", qwen, "--hf-config", CONFIG, "--skip", "model", "-v"],
              ["verify", qwen, "--hf-config", CONFIG, "--skip", "model", "--json"]),
             (["inspect-plan", broken], ["inspect-plan", broken, "--json"])]
    runs = here_many([cmd for pair in pairs for cmd in pair])
    for text, doc in zip(runs[::2], runs[1::2], strict=True):
        shown = text.stdout + text.stderr
        found = json.loads(doc.stdout)
        tokens = [f["path"] for f in found["findings"] if f["path"]]
        tokens += [b["fqn"] for b in found.get("boundaries", [])]
        assert tokens, doc.args
        for token in tokens:
            assert token in shown, (text.args, token)


def test_closed_pipe_ends_silently_with_the_verbs_code(broken: Path) -> None:
    def piped(args: str, reader: str) -> tuple[int, str]:
        script = f"{EXE} {args} 2>err.txt | {reader}; echo ${{PIPESTATUS[0]}}"
        run = subprocess.run(["bash", "-c", script], capture_output=True, text=True,
                             timeout=300, cwd=broken.parent, env=_env(COLUMNS="80"))
        return int(run.stdout.strip().splitlines()[-1]), (broken.parent / "err.txt").read_text()

    for reader in ("head -1 >/dev/null", "true"):
        for args, code in ((f"inspect-plan {EXAMPLE} --expand", 0),
                           (f"verify {EXAMPLE} -v", 0), ("schema", 0),
                           (f"inspect-plan {EXAMPLE} --json", 0), (f"verify {broken}", 1)):
            got, err = piped(args, reader)
            assert (got, err) == (code, ""), (args, reader)


def test_shell_completion_is_on() -> None:
    run = subprocess.run([str(EXE)], capture_output=True, text=True, timeout=300,
                         env=_env(_HPCODEGEN_COMPLETE="complete_bash",
                                  COMP_WORDS="hpcodegen insp", COMP_CWORD="1"))
    assert run.returncode == 0 and "inspect-plan" in run.stdout
    assert "--install-completion" in cli("-h", columns=200).stdout


def test_quiet_and_verbose(tmp_path: Path, broken: Path, batch) -> None:
    assert here("verify", EXAMPLE, "-q").stdout == ""
    failing = here("verify", EXAMPLE, broken, "-q", columns=300)
    assert failing.returncode == 1 and str(EXAMPLE) not in failing.stdout
    assert "outputs" in failing.stdout
    assert "info" in here("verify", EXAMPLE, "-v", columns=300).stdout
    inspect_q = here("inspect-plan", EXAMPLE, "-q")
    assert inspect_q.returncode == 0 and inspect_q.stdout == ""
    gen_q = batch["generate -q"]
    assert gen_q.returncode == 0 and gen_q.stdout == "" and gen_q.stderr == ""
    gen_v = batch["generate -v"]
    assert "codegen_meta.json" in gen_v.stdout and "KiB" in gen_v.stdout
    assert "$id" in here("schema", "-v").stderr
    dry = here("launch", EXAMPLE, "--nproc", "2", "--model-dir", CONFIG, "--dry-run", "-q")
    assert dry.returncode == 0


def _drain(master: int, chunks: list[bytes]) -> None:
    """Read a pseudo-terminal's master end until every slave end is closed (EIO)."""
    while True:
        try:
            data = os.read(master, 65536)
        except OSError:
            break
        if not data:
            break
        chunks.append(data)


def _on_tty(args: list[str], cwd: Path) -> tuple[int, str]:
    """Run with stderr on a pseudo-terminal; returns (exit code, what the terminal got)."""
    master, slave = pty.openpty()
    proc = subprocess.Popen([str(EXE), *args], stdout=subprocess.DEVNULL, stderr=slave,
                            cwd=cwd, env=_env(TERM="xterm", COLUMNS="100"))
    os.close(slave)
    chunks: list[bytes] = []
    _drain(master, chunks)
    os.close(master)
    return proc.wait(timeout=300), b"".join(chunks).decode("utf-8", "replace")


def _here_on_tty(args: list[str], cwd: Path) -> tuple[int, str]:
    """``_on_tty``'s run through the console script's function in this process
    (:func:`inproc.run`): stderr is the slave end of a fresh pseudo-terminal (a terminal
    device: the CLI's own isatty check decides), the environment ``_on_tty``'s; progress is
    switched off after, so no later in-process run writes to the closed terminal."""
    from hpcodegen import progress

    master, slave = pty.openpty()
    chunks: list[bytes] = []
    reader = threading.Thread(target=_drain, args=(master, chunks), daemon=True)
    reader.start()
    with open(slave, "w", encoding="utf-8") as tty:
        try:
            code = inproc.run(*args, cwd=cwd, columns=100, env={"TERM": "xterm"},
                              stderr=tty).returncode
        finally:
            progress.disable()
    reader.join(timeout=300)
    os.close(master)
    return code, b"".join(chunks).decode("utf-8", "replace")


def test_progress_on_a_terminal_only(batch) -> None:
    code, shown = batch["tty generate"]
    assert code == 0 and "building the model on the meta device" in shown
    code, shown = batch["tty verify"]
    assert code == 0 and "on the meta device" in shown
    piped = batch["generate -v"]  # stderr piped: no progress
    assert piped.returncode == 0 and piped.stderr == ""
    piped = batch["verify model piped"]
    assert piped.returncode == 0 and "meta device" not in piped.stderr
