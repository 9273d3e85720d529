"""The bundle's bytes: the frozen meta fields and the generated modeling module (the
libcst emitter over transformers' source, forward bodies, banner and diff).
"""
