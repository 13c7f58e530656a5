"""Threadline: an open-source Agent Protocol server for LangGraph agents."""

__version__ = "0.1.0"
