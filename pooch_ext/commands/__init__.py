"""Subcommands of the pooch-ext CLI, one module each."""
