"""Errors raised for bad model input (unknown zoo name, malformed spec or config)."""


class ModelInputError(ValueError):
    """Bad model input; the message names the file and field."""
