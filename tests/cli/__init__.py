"""Tests of the command line: commands, options and bad input."""
