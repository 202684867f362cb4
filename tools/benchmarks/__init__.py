"""Benchmarks of the product's own parts, each a script that prints a table:
`python -m tools.benchmarks.NAME`."""
