"""Suite-wide settings.

Text output folds to ``COLUMNS`` (80 when unset and piped). Tests that search messages for
a path or a phrase read them unfolded at 400 columns; ``tests/cli/test_cli_conventions.py``
checks the folding itself with ``COLUMNS=80``.
"""

import os

os.environ["COLUMNS"] = "400"
