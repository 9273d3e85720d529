"""JSON Schemas published with hpcodegen (installed as ``hpcodegen.schemas``)."""
