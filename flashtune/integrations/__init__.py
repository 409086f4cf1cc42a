"""Integrations with other libraries; each is an optional dependency, imported on use."""
