"""fedshard: federated learning over residency-routed, privacy-protected gradient shards.

Import cost matters: every Flower message starts a fresh ClientApp process, so this
package imports nothing heavy at the top level. Import the subpackage you need.
"""

__version__ = "0.1.0"

__all__ = ["__version__"]
