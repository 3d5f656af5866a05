"""The one exception type for user mistakes.

Entry points catch :class:`UserError` and print its message on one line with a non-zero exit;
anything else is a bug and keeps its traceback.
"""


class UserError(Exception):
    """A mistake in a config, a file or a command line, explained in one line."""


class ConfigError(UserError):
    """An invalid configuration key, value or type."""


class DataError(UserError):
    """An invalid or misaligned data file."""
