"""Installed packages: the local store of named packages (local.py), pulling from a hub (hub.py), and packing and
installing archives (archive.py)."""
