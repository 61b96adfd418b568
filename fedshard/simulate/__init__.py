"""``fedshard simulate``: a whole federation on one machine.

``run``       zones as gRPC servers in this process, sites in-process or on Flower's engine
``flower``    the Flower simulation engine (Ray) path
``baseline``  the central (non-federated) baseline a run is compared with
"""

__all__: list[str] = []
