"""The transformers modeling source a model class comes from (its text, hash and identity)."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

from hpcodegen.artifact.digest import bytes_digest
from hpcodegen.errors import PlanError, error


@dataclass(frozen=True)
class ModelingSource:
    """The modeling file of the installed transformers, as the meta records it.

    Attributes:
        module_name: dotted module (``transformers.models.llama.modeling_llama``).
        file_path: path relative to site-packages (``transformers/models/llama/...py``);
            never absolute, so bundles are the same on every machine.
        text: the file's text (read as bytes, decoded UTF-8, newlines kept).
        transformers_version: the installed version.
    """

    module_name: str
    file_path: str
    text: str
    transformers_version: str

    @property
    def sha256(self) -> str:
        return str(bytes_digest(self.text.encode("utf-8"))["sha256"])

    @property
    def line_count(self) -> int:
        """Lines as :func:`hpcodegen.artifact.digest.bytes_digest` counts them for
        ``outputs`` (over the bytes: a form feed or U+2028 does not start a line)."""
        return int(bytes_digest(self.text.encode("utf-8"))["lines"])


def modeling_source(model_cls: type) -> ModelingSource:
    """Locate and read the module that defines ``model_cls`` (imports transformers)."""
    import transformers

    module_name = model_cls.__module__
    module = sys.modules.get(module_name)
    file = getattr(module, "__file__", None)
    if not module_name.startswith("transformers.") or not file:
        raise PlanError([error("generate.source", model_cls.__name__,
                               f"{model_cls.__name__} is not defined in an installed "
                               f"transformers module ({module_name})")])
    root = Path(transformers.__file__).resolve().parent.parent
    path = Path(file).resolve()
    data = path.read_bytes()
    return ModelingSource(module_name, path.relative_to(root).as_posix(),
                          data.decode("utf-8"), transformers.__version__)
