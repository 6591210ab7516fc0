"""posenc's benchmark suite, kept out of the package: it measures the
installed posenc.  Run it with `python benchmarks/run.py` (or
`python -m posenc bench` from a source checkout); cli.py describes the modules."""
