"""What a plan must pass before it is frozen: coverage and divisibility, a split layer,
``--sp`` running on a sharded sequence and its nesting rule, and verify's own checks
on the meta about to be written.
"""
