"""The parallel link runner: a non-transacted link run by worker processes (runner.py,
worker.py), for CPU-heavy transformers that one Python thread cannot keep up with."""
