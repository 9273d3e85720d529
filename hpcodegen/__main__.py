"""``python -m hpcodegen`` runs the same CLI as the ``hpcodegen`` console script."""

from hpcodegen.cli.app import main

if __name__ == "__main__":
    main()
