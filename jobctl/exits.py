"""jobctl's exit codes, and the usage error that ends a command with EXIT_USAGE."""

EXIT_OK = 0
EXIT_API_ERROR = 1
EXIT_USAGE = 2
EXIT_CONNECT = 3
EXIT_NOT_FOUND = 4


class UsageError(Exception):
    """Bad arguments, or a job file that cannot be read or is not a job spec."""
