"""jobctl: the command line of jobsite (submit, follow and manage GPU jobs through the REST API)."""

__version__ = "0.1.0"
