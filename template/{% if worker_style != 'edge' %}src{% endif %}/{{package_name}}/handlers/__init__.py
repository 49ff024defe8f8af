"""Your job handlers: one module per job kind, registered with `@handler("kind")`.

Every module in this package is imported when the worker starts; see README.md here.
"""
