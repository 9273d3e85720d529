"""The cp tests' paths: the fixture configs and the repository root.

A module of its own (not ``conftest``): a test file's ``from conftest import ...`` resolves
to whichever ``conftest`` was imported first, another directory's when pytest collects
several directories in one run; this name is the cp tests' alone."""

from __future__ import annotations

from pathlib import Path

HERE = Path(__file__).resolve().parent
CONFIGS = HERE.parent / "fixtures" / "cp"
REPO = HERE.parents[1]
