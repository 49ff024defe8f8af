"""`python -m` entry point: the same as the `dashboard` command."""

from .cli import main

raise SystemExit(main())
