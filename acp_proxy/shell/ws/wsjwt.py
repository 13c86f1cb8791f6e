"""Bearer JWTs for a WebSocket listener: ``auth.jwks_file``, ``auth.jwt_issuer``,
``auth.jwt_audience`` (docs/remote.md).

Contract: owns checking a bearer token that is a JWT (RFC 7519) with PyJWT (the ``jwt`` extra,
imported only when ``auth.jwks_file`` is set): its signature by a key of the JWK set read once
at start (the key its ``kid`` names, or the set's only key), with that key's own algorithm and
never another (no ``none``, no HMAC: only asymmetric keys, RSA, EC or OKP, are accepted in the
set), its ``iss`` and ``aud`` the configured ones, its ``exp`` required and not past (30 s of
leeway for clocks). A refusal's reason names the claim that failed, never the token. A valid
token's ``iss`` and ``sub`` name the principal a held session belongs to (``detach_grace``: only
the same principal may reattach to it).
"""

from __future__ import annotations

from pathlib import Path

import jwt
from jwt import PyJWK, PyJWKSet

LEEWAY_S = 30
ASYMMETRIC = frozenset({"RSA", "EC", "OKP"})


class JwtVerifier:
    """The listener's JWT check. Raises ``ValueError`` at construction for a JWK set that
    cannot be read or holds no usable key."""

    def __init__(self, jwks_file: str, issuer: str, audience: str) -> None:
        try:
            text = Path(jwks_file).read_text(encoding="utf-8")
            keys = PyJWKSet.from_json(text).keys
        except OSError as exc:
            raise ValueError(f"auth.jwks_file {jwks_file}: {exc.strerror}") from None
        except (jwt.PyJWTError, ValueError, KeyError) as exc:
            raise ValueError(f"auth.jwks_file {jwks_file}: not a usable JWK set: {exc}") from None
        usable = [k for k in keys if k.key_type in ASYMMETRIC]
        if not usable:
            raise ValueError(
                f"auth.jwks_file {jwks_file}: no RSA, EC or OKP public key (shared-secret keys "
                "are not accepted)"
            )
        self.keys = usable
        self.issuer = issuer
        self.audience = audience

    def _key(self, token: str) -> PyJWK:
        kid = jwt.get_unverified_header(token).get("kid")
        if kid is None:
            if len(self.keys) == 1:
                return self.keys[0]
            raise jwt.InvalidTokenError("the token names no key (kid) and the set has several")
        for key in self.keys:
            if key.key_id == kid:
                return key
        raise jwt.InvalidTokenError("the token's key (kid) is not in the JWK set")

    def refusal(self, token: str) -> str | None:
        """Why ``token`` is refused, or ``None`` when it is valid."""
        return self.check(token)[0]

    def check(self, token: str) -> tuple[str | None, str | None]:
        """Why ``token`` is refused (or ``None``), and whom it names when it is valid: its
        ``iss`` and ``sub`` (``None`` without a ``sub``)."""
        try:
            key = self._key(token)
            claims = jwt.decode(
                token,
                key=key,
                algorithms=[key.algorithm_name],
                audience=self.audience,
                issuer=self.issuer,
                leeway=LEEWAY_S,
                options={"require": ["exp", "iss", "aud"]},
            )
        except jwt.PyJWTError as exc:
            return str(exc) or type(exc).__name__, None
        subject = claims.get("sub")
        return None, (f"{claims['iss']} {subject}" if isinstance(subject, str) else None)
