"""``fedshard simulate``: a whole federation on one machine.

``run``       zones as gRPC servers in this process, sites in-process or on Flower's engine
``_flower``   the Flower simulation engine (Ray) path
``baseline``  the central (non-federated) baseline a run is compared with
"""

from typing import TYPE_CHECKING

from fedshard._surface import lazy_surface

if TYPE_CHECKING:
    from fedshard.simulate.baseline import centralized_baseline
    from fedshard.simulate.run import DataPlane, Engine, simulate

__all__ = ["DataPlane", "Engine", "centralized_baseline", "simulate"]

__getattr__ = lazy_surface(
    __name__, {"DataPlane": "run", "Engine": "run", "centralized_baseline": "baseline", "simulate": "run"}
)
