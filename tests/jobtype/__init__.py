"""A job type that exists only in the tests, added the way docs/architecture.md ("Adding a
job type") says: one spec (spec.py, registered at start-up instead of listed in the
registry module), one handler module (handler.py), one endpoint (endpoint.py). Its target
table is the test's own schema, created by the test."""
