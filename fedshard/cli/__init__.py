"""The ``fedshard`` command line."""
