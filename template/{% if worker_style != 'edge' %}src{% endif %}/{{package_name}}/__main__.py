"""`python -m` entry point: the same commands as the console script."""

from .cli import main

raise SystemExit(main())
