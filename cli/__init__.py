"""The Typer front end, installed as ``hpcodegen.cli``: parse options, call the library, exit."""
