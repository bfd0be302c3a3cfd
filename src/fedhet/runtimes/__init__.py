"""Runtimes execute the clients of an algorithm: in-process (default); others plug into the same loop."""
