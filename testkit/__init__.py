"""The local stack that the template's tests and its benchmark share: a PostgreSQL 15 cluster
shaped like a Supabase database (`cluster`, `stack`, `sql/`), the PostgREST stand-in in front
of it (`postgrest`), and the template and the projects it renders (`project`).

What only the tests use lives in tests/support/. Nothing here is ever rendered into a
generated project.
"""
