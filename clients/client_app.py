"""Flower ClientApp entry point (``clientapp = "clients.client_app:app"``).

The app itself is built in the library (:mod:`fedshard.transports.flower.client_app`);
it imports only Flower at module level, since Flower may start a process per message.
"""

from fedshard.transports.flower.client_app import create_client_app

__all__ = ["app"]

app = create_client_app()
