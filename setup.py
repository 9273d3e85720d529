"""Build hook: the packages are found, and the wheel leaves out the dev-only example regenerator.

Every package under ``hpcodegen/`` is found (a new subpackage cannot be left out of the
wheel); ``cli/`` and ``schemas/`` are added under their installed names, ``hpcodegen.cli``
and ``hpcodegen.schemas`` (pyproject.toml's ``package-dir`` maps their directories).

``hpcodegen.generate.examples`` rewrites this repository's ``examples/`` (``make examples``);
it is useless outside a checkout, so the wheel does not ship it. Editable installs map the
source tree and keep it importable for development. Everything else is in pyproject.toml.
"""

from setuptools import find_packages, setup
from setuptools.command.build_py import build_py

#: (package, module) pairs that stay out of the wheel
DEV_ONLY = {("hpcodegen.generate", "examples")}


class BuildPyWithoutDevModules(build_py):
    def find_package_modules(self, package, package_dir):
        modules = super().find_package_modules(package, package_dir)
        return [m for m in modules if (m[0], m[1]) not in DEV_ONLY]


#: every package of the wheel: found under hpcodegen/, plus the two remapped root directories
PACKAGES = [*find_packages(include=["hpcodegen", "hpcodegen.*"]), "hpcodegen.cli",
            "hpcodegen.schemas"]

setup(packages=PACKAGES, cmdclass={"build_py": BuildPyWithoutDevModules})
