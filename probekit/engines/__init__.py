"""Engines: what runs a model. Everything above this package talks to an engine, never to a
model library's internals."""
