"""What the roles say to each other, free of any transport.

``messages``   the control-plane messages (coordinator ↔ site) and their kinds
``rounds``     round specs, push receipts, aggregates and their summaries, partial sums, the
               (zone, group) key of an aggregate (coordinator/site ↔ zone)
``channels``   the channel protocols the roles depend on: :class:`SiteGateway`, :class:`ZoneClient`
``codes``      refusal codes: an error's code, a code's error class, one-line reasons
``codes``      refusals across the wire: a typed code, the error it raises, one line of reason
``binding``    a node's proof that it speaks for its site (the payload it signs, the check)

Transports (in-process, Flower, gRPC) implement the channels; the coordinator, sites
and zones only ever see these types.
"""

from typing import TYPE_CHECKING

from fedshard._surface import lazy_surface

if TYPE_CHECKING:
    from fedshard.protocol.channels import SiteGateway, ZoneClient, ZoneConnector
    from fedshard.protocol.codes import RefusalCode
    from fedshard.protocol.messages import (
        EvaluateInstruction,
        EvaluateReport,
        MessageKind,
        PrivacyPlan,
        QueryRequest,
        SiteInfo,
        TrainInstruction,
        TrainReport,
    )
    from fedshard.protocol.rounds import AggregateSummary, PushReceipt, RoundSpec

__all__ = [
    "AggregateSummary",
    "EvaluateInstruction",
    "EvaluateReport",
    "MessageKind",
    "PrivacyPlan",
    "PushReceipt",
    "QueryRequest",
    "RefusalCode",
    "RoundSpec",
    "SiteGateway",
    "SiteInfo",
    "TrainInstruction",
    "TrainReport",
    "ZoneClient",
    "ZoneConnector",
]

__getattr__ = lazy_surface(
    __name__,
    {
        "AggregateSummary": "rounds",
        "EvaluateInstruction": "messages",
        "EvaluateReport": "messages",
        "MessageKind": "messages",
        "PrivacyPlan": "messages",
        "PushReceipt": "rounds",
        "QueryRequest": "messages",
        "RefusalCode": "codes",
        "RoundSpec": "rounds",
        "SiteGateway": "channels",
        "SiteInfo": "messages",
        "TrainInstruction": "messages",
        "TrainReport": "messages",
        "ZoneClient": "channels",
        "ZoneConnector": "channels",
    },
)
