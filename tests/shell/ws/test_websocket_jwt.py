"""A WebSocket listener that accepts JWTs (``auth.jwks_file``, ``jwt_issuer``, ``jwt_audience``):
a token signed by the set's key with the right claims opens a session; expired, another
audience or issuer, no ``exp``, another key, ``alg: none`` or an HMAC token keyed with the public
key are refused with 401 before any ACP message. Keys are made here with ``cryptography``, the
tokens with PyJWT (the ``jwt`` extra)."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import time
from pathlib import Path

import anyio
import jwt
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from jwt.algorithms import ECAlgorithm
from listen_harness import TIMEOUT, TINY, listening
from proxy_harness import init_response, request, write_config
from test_websocket import raw_upgrade, ws_url
from websockets.asyncio.client import connect as ws_connect

ISSUER = "https://issuer.example"
AUDIENCE = "acp-agents"


def claims(**changes: object) -> dict[str, object]:
    now = int(time.time())
    return {"iss": ISSUER, "aud": AUDIENCE, "sub": "me", "exp": now + 300, **changes}


def b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def hmac_forged(key: ec.EllipticCurvePrivateKey) -> str:
    public = key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    head = b64(json.dumps({"alg": "HS256", "typ": "JWT", "kid": "k1"}).encode())
    body = b64(json.dumps(claims()).encode())
    mac = hmac.new(public, f"{head}.{body}".encode(), hashlib.sha256).digest()
    return f"{head}.{body}.{b64(mac)}"


@pytest.mark.anyio
async def test_jwt_bearer_checked_before_the_upgrade(tmp_path: Path) -> None:
    key = ec.generate_private_key(ec.SECP256R1())
    other = ec.generate_private_key(ec.SECP256R1())
    jwk = json.loads(ECAlgorithm.to_jwk(key.public_key()))
    jwks = tmp_path / "jwks.json"
    jwks.write_text(json.dumps({"keys": [{**jwk, "kid": "k1", "alg": "ES256", "use": "sig"}]}))
    config = write_config(
        tmp_path / "c.yaml",
        f"auth:\n  jwks_file: {jwks}\n  jwt_issuer: {ISSUER}\n  jwt_audience: {AUDIENCE}\n",
    )

    def signed(signer: ec.EllipticCurvePrivateKey = key, **changes: object) -> str:
        return jwt.encode(claims(**changes), signer, algorithm="ES256", headers={"kid": "k1"})

    good = signed()
    refused = {
        "expired": (signed(exp=int(time.time()) - 120), "Signature has expired"),
        "audience": (signed(aud="other"), "Audience doesn't match"),
        "issuer": (signed(iss="https://evil.example"), "Invalid issuer"),
        "no exp": (signed(exp=None), 'Token is missing the "exp" claim'),
        "another key": (signed(other), "Signature verification failed"),
        "alg none": (
            jwt.encode(claims(), "", algorithm="none", headers={"kid": "k1"}),
            "The specified alg value is not allowed",
        ),
        # HS256 keyed with the public key (the algorithm confusion attack).
        "hmac with the public key": (hmac_forged(key), "The specified alg value is not allowed"),
    }
    with anyio.fail_after(TIMEOUT):
        async with listening(
            "--config", config, "--listen", "ws://127.0.0.1:0/acp", agent=TINY
        ) as proxy:
            url = await ws_url(proxy)
            host = url.removeprefix("ws://").partition("/")[0]
            for case, (token, reason) in refused.items():
                answer = await raw_upgrade(url, {"Host": host, "Authorization": f"Bearer {token}"})
                assert answer.startswith(b"HTTP/1.1 401 Unauthorized\r\n"), case
                assert (
                    answer.endswith(
                        b"a valid bearer token is required in the Authorization header (%s)\n"
                        % reason.encode()
                    )
                    or case == "no exp"
                ), (case, answer)
            async with ws_connect(
                url, additional_headers={"Authorization": f"Bearer {good}"}
            ) as ws:
                await ws.send(request(1, "initialize", {}).rstrip(b"\n"), text=True)
                assert await ws.recv(decode=False) == init_response(1).rstrip(b"\n")
            await proxy.event("connection closed", conn=len(refused) + 1)
            proxy.terminate()
            assert await proxy.wait() == 0
    assert proxy.count("agent started") == 1
    assert good.encode() not in proxy.stderr
