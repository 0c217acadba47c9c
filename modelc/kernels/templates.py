"""Importing this module registers every kernel template, most specific first."""
from . import conv2d  # noqa: F401
