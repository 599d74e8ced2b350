"""The architecture section of the package format; it lives with the other sections (package_format.py)."""

from .package_format import Architecture

__all__ = ["Architecture"]
