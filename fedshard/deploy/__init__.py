"""Deployment: provisioning a federation's keys, and running the aggregator and the sites
as separate processes on Flower's deployment engine (SuperLink, SuperNodes)."""
