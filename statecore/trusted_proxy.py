"""An authenticating proxy's word on who is signed in (docs/protocol.md § Identity).

oauth2-proxy (and proxies like it) sign people in and pass the name on in a request header:
``X-Forwarded-User``, ``X-Auth-Request-User`` or ``X-Forwarded-Email``. Such a header is believed
only when the request's *peer* (the address of the TCP connection, never an ``X-Forwarded-For``
header) is one of the configured proxy addresses (``hitl up --trusted-proxy CIDR``); from anyone
else it is ignored, and the request needs a token as always. The API and the reviewer UI decide
this the same way, here: stdlib only, so the UI and the server share it.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Iterable, Sequence

# Looked at in this order; the first one the proxy sent names the user.
USER_HEADERS: tuple[str, ...] = ("x-forwarded-user", "x-auth-request-user", "x-forwarded-email")
# A name the proxy may give: letters, digits and ``_ . @ + -`` (an e-mail address fits), 1-64.
PROXY_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.@+-]{0,63}$")
Network = ipaddress.IPv4Network | ipaddress.IPv6Network


def parse_networks(cidrs: Iterable[str]) -> list[Network]:
    """``10.0.0.0/8``, ``127.0.0.1`` (one address), ``::1`` …; ValueError naming a bad one."""
    out: list[Network] = []
    for c in cidrs:
        try:
            out.append(ipaddress.ip_network(c.strip(), strict=False))
        except ValueError:
            raise ValueError(f"--trusted-proxy {c!r} is not an address or a CIDR block (e.g. 10.0.0.0/8)") from None
    return out


class TrustedProxies:
    """The configured proxy addresses and the role their users get."""

    def __init__(self, cidrs: Sequence[str] = (), role: str = "reviewer") -> None:
        self.networks = parse_networks(cidrs)
        self.role = role

    def __bool__(self) -> bool:
        return bool(self.networks)

    def trusts(self, peer: str | None) -> bool:
        """Whether the connection's peer address is one of the proxies (an IPv4 address seen as
        ``::ffff:a.b.c.d`` counts as itself)."""
        if not peer or not self.networks:
            return False
        try:
            ip = ipaddress.ip_address(peer.split("%", 1)[0])
        except ValueError:
            return False
        if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
            ip = ip.ipv4_mapped
        return any(ip.version == n.version and ip in n for n in self.networks)

    def user(self, peer: str | None, headers: Iterable[tuple[bytes | str, bytes | str]]) -> str | None:
        """The user the proxy names, when ``peer`` is a trusted proxy and it names one; else None.
        ValueError when a trusted proxy's header is unusable (sent twice, or not a name)."""
        if not self.trusts(peer):
            return None
        found: dict[str, list[str]] = {}
        for k, v in headers:
            name = (k.decode("latin-1") if isinstance(k, bytes) else k).lower()
            if name in USER_HEADERS:
                found.setdefault(name, []).append(v.decode("latin-1") if isinstance(v, bytes) else v)
        for header in USER_HEADERS:
            values = found.get(header)
            if not values:
                continue
            if len(values) > 1:
                raise ValueError(f"the proxy sent {header} {len(values)} times")
            value = values[0].strip()
            if not PROXY_NAME.match(value):
                raise ValueError(f"the proxy's {header} is not a usable name (1-64 letters, digits, _ . @ + -)")
            return value
        return None
