"""The benchmark behind ``python -m flatgather bench``."""
