"""Frozen-plan reading, classification and prediction (pure: no torch at import; the rules
that take a built model, such as :mod:`.loss_parallel`, import it inside those functions)."""
