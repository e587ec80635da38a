"""Datasets (token-exact prompts), arrival schedules, the async load generator and per-request records."""
