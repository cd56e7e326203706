"""Runners: one implementation under test each."""
