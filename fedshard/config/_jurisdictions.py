"""Which jurisdiction codes a federation's sites may have, so that none escapes a residency rule.

A residency rule speaks of jurisdictions by code (``origin: [EU]``); a site whose
code no rule names is matched only by the rules for ``*``. A Paris hospital written
``jurisdiction: FR`` under rules that speak of ``EU`` would thus have its personal
shards treated as "allowed anywhere". A federation's config is therefore refused, at
load, when one of its sites has a jurisdiction that

* is a member of a block that a rule or a zone names, while nothing names the site's own
  code (``FR`` where the rules say ``EU``: write ``EU``, or add rules for ``FR``); or
* is known nowhere: no zone's region, no rule's code, no ISO 3166-1 country code and no
  block of :data:`BLOCKS` (a typo such as ``EUR`` or ``XX``).

The tables here are the documented mapping (README, "Residency"): :data:`BLOCKS` gives the
members of the blocks the default rules and common policies use, :data:`COUNTRIES` the
ISO 3166-1 alpha-2 codes (with ``UK``, ISO's reserved code for the United Kingdom, and
``XK``, the code in common use for Kosovo).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

__all__ = ["BLOCKS", "COUNTRIES", "EU_MEMBERS", "check_jurisdictions"]

_EU = "AT BE BG HR CY CZ DK EE FI FR DE GR HU IE IT LV LT LU MT NL PL PT RO SK SI ES SE"
_ISO = """
    AD AE AF AG AI AL AM AO AQ AR AS AT AU AW AX AZ BA BB BD BE BF BG BH BI BJ BL BM BN BO BQ BR BS BT BV
    BW BY BZ CA CC CD CF CG CH CI CK CL CM CN CO CR CU CV CW CX CY CZ DE DJ DK DM DO DZ EC EE EG EH ER ES
    ET FI FJ FK FM FO FR GA GB GD GE GF GG GH GI GL GM GN GP GQ GR GS GT GU GW GY HK HM HN HR HT HU ID IE
    IL IM IN IO IQ IR IS IT JE JM JO JP KE KG KH KI KM KN KP KR KW KY KZ LA LB LC LI LK LR LS LT LU LV LY
    MA MC MD ME MF MG MH MK ML MM MN MO MP MQ MR MS MT MU MV MW MX MY MZ NA NC NE NF NG NI NL NO NP NR NU
    NZ OM PA PE PF PG PH PK PL PM PN PR PS PT PW PY QA RE RO RS RU RW SA SB SC SD SE SG SH SI SJ SK SL SM
    SN SO SR SS ST SV SX SY SZ TC TD TF TG TH TJ TK TL TM TN TO TR TT TV TW TZ UA UG UM US UY UZ VA VC VE
    VG VI VN VU WF WS YE YT ZA ZM ZW UK XK
"""


def _codes(text: str) -> frozenset[str]:
    return frozenset(text.split())


EU_MEMBERS = _codes(_EU)
"""The 27 member states of the European Union (ISO 3166-1 alpha-2)."""

BLOCKS: Mapping[str, frozenset[str]] = {
    "EU": EU_MEMBERS,
    "EEA": EU_MEMBERS | {"IS", "LI", "NO"},
}
"""Blocks of countries that a residency policy may name instead of each country: block → members."""

COUNTRIES = _codes(_ISO)
"""ISO 3166-1 alpha-2 country codes, with ``UK`` and ``XK``."""


def check_jurisdictions(
    sites: Iterable[tuple[str, str]], zone_regions: Iterable[str], rule_codes: Iterable[str]
) -> None:
    """Refuse a site jurisdiction that could escape the residency rules (see the module docstring).

    ``sites`` are (site id, jurisdiction) pairs; ``zone_regions`` the zones' regions;
    ``rule_codes`` every code the residency rules name (origins, regions, serve-to lists).

    Raises
    ------
    ValueError
        One line: the first such site, what its code is, and what to write instead.
    """
    named = frozenset(rule_codes) | frozenset(zone_regions)
    for site_id, code in sites:
        if code in named:
            continue
        blocks = sorted(block for block in named & BLOCKS.keys() if code in BLOCKS[block])
        if blocks:
            block = blocks[0]
            raise ValueError(
                f"site {site_id}: jurisdiction {code} is a member of {block}, and the residency rules and zones "
                f"name {block}, never {code}: {block}'s rules would not apply to it; write `jurisdiction: {block}` "
                f"(or add rules and zones for {code})"
            )
        if code not in COUNTRIES and code not in BLOCKS:
            regions = ", ".join(sorted(named)) or "none"
            raise ValueError(
                f"site {site_id}: jurisdiction {code} is no zone's region, no residency rule names it, and it is "
                f"not an ISO 3166 country code; the regions and codes this federation names: {regions}"
            )
