"""Your job handlers: one module per job kind, registered with `@handler("kind")`.

This folder is yours: add, change and delete modules freely (the two examples included).
Every module in it is imported when the worker starts; see README.md here.
"""
