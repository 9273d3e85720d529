"""Where a plan comes from: transformers' own TP plan, the package rules, the user's
recipe, the generation record ``--check`` reads back, and the glob and style
vocabulary they are written in.
"""
