"""Megatron's layout found where no plan names a layer: from the module tree
(``seeds``), the traced dataflow (pair and attention seeds, checked on one rank's
heads) and fused projections' row order (read off the traced forward, checked on a
rank's copy); ``module_facts`` is what a module's class and forward say.
"""
