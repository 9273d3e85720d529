"""Writing the bundle to ``-o`` and reporting generate's result.
"""
