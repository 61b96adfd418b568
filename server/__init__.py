"""Aggregator entry points: the Flower ServerApp (coordinator)."""
