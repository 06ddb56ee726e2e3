"""The training corpus mined from real project histories (see README.md beside this file)."""
