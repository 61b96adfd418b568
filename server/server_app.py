"""Flower ServerApp entry point (``serverapp = "server.server_app:app"``).

The app itself is built in the library (:mod:`fedshard.transports.flower.server_app`).
"""

from fedshard.transports.flower.server_app import create_server_app

__all__ = ["app"]

app = create_server_app()
