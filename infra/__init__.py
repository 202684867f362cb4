"""Engines and servers: start, probe and stop them; nothing here knows about verdicts."""
