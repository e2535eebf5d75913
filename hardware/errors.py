"""Errors raised for bad hardware input (unknown preset, malformed cluster file)."""


class HardwareInputError(ValueError):
    """Bad hardware input; the message names the file and field."""
