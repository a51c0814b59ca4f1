"""How the simulator checks the clouds' credentials, as strictly as the clouds do.

- Bedrock: every request is signed with AWS Signature Version 4 (service
  ``bedrock``, any region), checked by rebuilding the canonical request from
  what arrived (method, path as sent, query, the signed headers, the body)
  with botocore's own signer, under the one key pair the simulator knows
  (``SIM_AWS_ACCESS_KEY_ID`` / ``SIM_AWS_SECRET_ACCESS_KEY``, any session
  token). An unknown key is 403 ``UnrecognizedClientException``; a wrong
  secret, a tampered request or an ``x-amz-date`` more than five minutes off
  is 403 ``InvalidSignatureException``. A Bedrock API key
  (``Authorization: Bearer``) is accepted when it is ``SIM_BEDROCK_API_KEY``
  or starts with ``sim:``.
- Vertex: ``POST /token`` takes Google's OAuth2 JWT-bearer grant, checks the
  RS256 assertion against the public half of the simulator's own service
  account key (``vertex_service_account``), its audience (the token URI,
  or Google's, which google-auth always signs for),
  scope (cloud-platform) and times, and issues an access token that lives
  ``Simulator.vertex_token_ttl`` seconds. A bad assertion is 400
  ``invalid_grant``; an unknown or expired token on a call is 401.

One channel's misbehaviour rides on its credentials, as ``sim:k=v,…`` API
keys do elsewhere: a session token or Bedrock API key reading ``sim:k=v,…``,
and a service account whose client_email reads ``sim-k-v+k-v@…``
(``vertex_service_account(base_url, "status=500")`` writes one).
"""

from __future__ import annotations

import functools
import hashlib
import hmac
import re
import secrets
import time
from collections import Counter
from datetime import UTC, datetime
from typing import Any

from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.compat import HTTPHeaders
from botocore.credentials import Credentials
from cryptography.hazmat.primitives import serialization
from google.auth import exceptions as google_exceptions
from google.auth import jwt

from simulator.http import Request
from simulator.requests import parse_pairs
from simulator.wire.converse import bedrock_error_headers

SIM_AWS_ACCESS_KEY_ID = "AKIAHOPBASESIMULATOR"
SIM_AWS_SECRET_ACCESS_KEY = "hopbase/simulator/secret/access/key+test"
SIM_BEDROCK_API_KEY = "ABSKaG9wYmFzZS1zaW11bGF0b3ItYmVkcm9jay1hcGkta2V5"
SIGNATURE_WINDOW = 300  # seconds an x-amz-date may be off, as AWS allows
_UNRECOGNIZED = "The security token included in the request is invalid."

CLOUD_PLATFORM = "https://www.googleapis.com/auth/cloud-platform"
JWT_GRANT = "urn:ietf:params:oauth:grant-type:jwt-bearer"
GOOGLE_TOKEN_URI = "https://oauth2.googleapis.com/token"
VERTEX_KEY_ID = "5e1f0c0ffee0hopbase0simulator0key0000001"
DEFAULT_TOKEN_TTL = 3600.0
# The simulator's own throwaway service-account key, fixed so that a simulator
# process and the test that writes a key for it agree without sharing a file.
# It signs nothing real, is trusted by nothing but the simulator, and must
# never be used for anything else.
_VERTEX_PRIVATE_KEY = """-----BEGIN PRIVATE KEY-----
MIIEvgIBADANBgkqhkiG9w0BAQEFAASCBKgwggSkAgEAAoIBAQCvbO05kV+kUooR
xjFNk5wgnXvBcxLJ4F3c4zeMzXL5G1NfZlSpMw7ZeMjmS6Bu6mvQQ15ipAv0rQR9
sCR+LhHQeTjtfs7dP2I84CK3yLJDfgyLnM9yb3I97VA5iOLb4WgahntEgx6nv+zG
mgM5VVY2UzeQEIt+wX8283PCLVR/k7PjBTwoRbuH8Q5Pxk4m3qYQgC3wogVNLRlt
nLElmXOB0AVnm/fCCObrkdHXs/ruWrLmwUPMnLzD6oeZGN5X+w1FBpQKdhue1nEu
uKa8C5BqulGBj1yXG2yd5rW42YCDVFoEpaiuj1oE7pCAf9Pp14iK0DCySug39mor
QaDqvjClAgMBAAECggEAAViht4F+S+E7dPhqmU6ObyUvspmwlXjKbW2jDEp0sYgD
oR5niA4ORnVIffHw8pVRi87DFru+gOz5+w0Ivqiw5M6Cb1oknPCLg7Nl/qAzFuwY
alLdQ9z72rQIijvDnzDCbw45AeaRPVyiwfXdeQ87KMxuGMuiQPXtUL77ICPfgVXA
1ZX3vJ/PIbDkrFrUpsP1utVHMxdPOonZklXZ6EfXVbCbJRoNaTN20SX4GGtd2DS0
ET2wemQH4A0dS2py3bdzLy2BwEMtyxuTK/vsWqrh6Z+4GDxqe/0AXlRwfM5EJgt6
/AKrCBN9v7qr7/TcP6ghAS7b3QQ0+uvEXL7qnB/uiQKBgQDac6VuCiLQ7CjQCi/w
mmfC4drc/KN03Ku9lUCVIJY70ge8gONhtDTsotLdDXF9w066GMWnq7HHtK+tGs6W
o/Yx1FjDa88Zi8+3gTILqPNPjwYgsFvZAi8FFiuV/08h5Bj3qHQ4pSjTvojCYmiM
tIJayElItzZ0BDxdRCmb9Es/3QKBgQDNlAgUJy7IY4X6eDt9z4dCYYIwaHM+XmUw
8oJey6IoHHbSgdvUOLfkRRVdYUtvlaNPp55Binnj0Lr76TW9xLmbqtFR/gwlgG1w
Voo3bGA6B5ACPfOZ9S5NYO9y5LZdZjzQvXnqj9yLC3M+drdf7uKFmlaGrvskydRx
xhXz48SLaQKBgQCpmy5u8Dm14hWR6Mbt1MQJABhQiWpTel1xFWeOIT3jdh+BkMR6
AFMzAvwamqxqC3CddkxH8TtXpYbcLLsHJIgqigbcu2CRIgcFH67+dI9sTsxgJu04
4MQm+96dWBtVYeasqkKKFFlNhVpjKcqorCGlYGndpjoF+5/ufdScfCDMlQKBgQCu
bSmln9FL6VWmPRmNF+ZV5lIGLLmLc6A8Nad0Myc1DWGsHs6cdDtjDVKhVoog9UAJ
t9jJF2twZowgbbFRgHdTo03TWdCIiT1SEbtYZzYGRqBjppjoSmWs9dB1FaW9/Z8g
JYQqB0JDH8X6e9P/K7s7TMaZpCInBrCgkEfUFa+P8QKBgGoAm4fSR/f78Le4x+uD
VTcZyX/eGIW53MmIHwnV/v5vWd0v8i19iflPTeUEd9FfichFNqrxoJoNCdEzvIKF
6cvSGg7p8ATv5oyDrknURMQDsDyP6ROZfobcs03DKGSaPnivjd6qhUf3RSNrg9wm
HKvn5x2xe7Z0PZdtgMaaT2b0
-----END PRIVATE KEY-----
"""


class AuthRefused(Exception):
    """A request the cloud would refuse, with the answer it would give."""

    def __init__(self, status: int, body: dict[str, Any], headers: dict[str, str] | None = None) -> None:
        super().__init__(status)
        self.status, self.body, self.headers = status, body, headers or {}


def _bedrock_refusal(status: int, error_type: str, message: str) -> AuthRefused:
    return AuthRefused(status, {"message": message}, bedrock_error_headers(error_type))


# --------------------------------------------------------------------------- Bedrock


class _ReceivedSigner(SigV4Auth):
    """botocore's SigV4, told which headers the client signed rather than choosing them."""

    def __init__(self, credentials: Credentials, region: str, signed: list[str]) -> None:
        super().__init__(credentials, "bedrock", region)
        self._signed = signed

    def headers_to_sign(self, request: AWSRequest) -> HTTPHeaders:
        headers = HTTPHeaders()
        for name in self._signed:
            headers[name] = request.headers.get(name, "")
        return headers


def bedrock_credential(request: Request) -> str | None:
    """Check a Bedrock request's credentials; the credential carrying directives, if any."""
    auth = request.headers.get("authorization", "")
    if auth[:7].lower() == "bearer ":
        key = auth[7:].strip()
        if key == SIM_BEDROCK_API_KEY or key.startswith("sim:"):
            return key
        raise _bedrock_refusal(403, "UnrecognizedClientException", _UNRECOGNIZED)
    if not auth:
        raise _bedrock_refusal(403, "MissingAuthenticationTokenException", "Missing Authentication Token")
    return _verify_sigv4(request, auth)


def _verify_sigv4(request: Request, auth: str) -> str | None:
    algorithm, _, rest = auth.partition(" ")
    fields = dict(part.strip().partition("=")[::2] for part in rest.split(","))
    scope = fields.get("Credential", "").split("/")
    amz_date = request.headers.get("x-amz-date", "")
    if algorithm != "AWS4-HMAC-SHA256" or len(scope) != 5 or not fields.get("SignedHeaders") \
            or not re.fullmatch(r"[0-9a-f]{64}", fields.get("Signature", "")) or not amz_date:
        raise _bedrock_refusal(400, "IncompleteSignatureException", f"Authorization header is malformed: {auth[:40]}")
    access_key, day, region, service, terminal = scope
    if access_key != SIM_AWS_ACCESS_KEY_ID:
        raise _bedrock_refusal(403, "UnrecognizedClientException", _UNRECOGNIZED)
    if service != "bedrock" or terminal != "aws4_request" or not amz_date.startswith(day):
        raise _bedrock_refusal(403, "InvalidSignatureException",
                               "Credential should be scoped to a valid date, region and service 'bedrock'.")
    try:
        signed_at = datetime.strptime(amz_date, "%Y%m%dT%H%M%SZ").replace(tzinfo=UTC).timestamp()
    except ValueError:
        raise _bedrock_refusal(400, "IncompleteSignatureException", "x-amz-date is not ISO 8601 basic") from None
    if abs(time.time() - signed_at) > SIGNATURE_WINDOW:
        raise _bedrock_refusal(403, "InvalidSignatureException",
                               f"Signature expired: {amz_date} is more than 5 min. from now.")
    signed = fields["SignedHeaders"].split(";")
    if "host" not in signed:
        raise _bedrock_refusal(403, "InvalidSignatureException", "'Host' or ':authority' must be a 'SignedHeader'.")
    content_hash = request.headers.get("x-amz-content-sha256")
    if content_hash and content_hash != hashlib.sha256(request.body).hexdigest():
        # The canonical request carries this header, not the body: a hash that lies must be caught here.
        raise _bedrock_refusal(403, "InvalidSignatureException",
                               "The provided 'x-amz-content-sha256' header does not match what was computed.")
    token = request.headers.get("x-amz-security-token")
    query = f"?{request.raw_query}" if request.raw_query else ""
    url = f"http://{request.headers.get('host', '')}{request.raw_path}{query}"
    received = AWSRequest(method=request.method, url=url,
                          headers={name: request.headers[name] for name in signed if name in request.headers},
                          data=request.body)
    received.context["timestamp"] = amz_date
    signer = _ReceivedSigner(Credentials(access_key, SIM_AWS_SECRET_ACCESS_KEY, token), region, signed)
    expected = signer.signature(signer.string_to_sign(received, signer.canonical_request(received)), received)
    if not hmac.compare_digest(expected, fields["Signature"]):
        raise _bedrock_refusal(403, "InvalidSignatureException",
                               "The request signature we calculated does not match the signature you provided. "
                               "Check your AWS Secret Access Key and signing method.")
    return token


# --------------------------------------------------------------------------- Vertex


@functools.cache
def _public_key() -> bytes:
    private = serialization.load_pem_private_key(_VERTEX_PRIVATE_KEY.encode(), password=None)
    public = private.public_key()
    return public.public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)


def vertex_service_account(base_url: str, directives: str = "", project_id: str = "hopbase-sim") -> dict[str, Any]:
    """A service-account JSON key the simulator at base_url accepts.

    directives ("status=500 tag=x") are carried in the client_email, so
    every call made with a token this key obtains gets them, as a sim:
    API key's calls do; token_status=N fails the token exchange itself.
    """
    pairs = parse_pairs(directives)
    local = "sim-" + "+".join(f"{k}-{v}" for k, v in pairs.items()) if pairs else "simulator"
    base = base_url.rstrip("/")
    email = f"{local}@{project_id}.iam.gserviceaccount.com"
    return {
        "type": "service_account",
        "project_id": project_id,
        "private_key_id": VERTEX_KEY_ID,
        "private_key": _VERTEX_PRIVATE_KEY,
        "client_email": email,
        "client_id": "100000000000000000001",
        "auth_uri": f"{base}/o/oauth2/auth",
        "token_uri": f"{base}/token",
        "auth_provider_x509_cert_url": f"{base}/oauth2/v1/certs",
        "client_x509_cert_url": f"{base}/robot/v1/metadata/x509/{email}",
        "universe_domain": "googleapis.com",
    }


def email_directives(email: str) -> str | None:
    """The sim: directives a client_email such as sim-status-500+tag-x@… carries."""
    local = email.partition("@")[0]
    if not local.startswith("sim-"):
        return None
    pairs = (piece.partition("-") for piece in local[4:].split("+"))
    return "sim:" + ",".join(f"{key}={value}" for key, _, value in pairs if key)


def google_unauthenticated(message: str) -> AuthRefused:
    body = {"error": {"code": 401, "message": message, "status": "UNAUTHENTICATED"}}
    challenge = 'Bearer realm="https://accounts.google.com/", error="invalid_token"'
    return AuthRefused(401, body, {"www-authenticate": challenge})


class TokenIssuer:
    """The token endpoint's memory: live tokens, and how many exchanges each client made."""

    def __init__(self) -> None:
        self._tokens: dict[str, tuple[float, str]] = {}  # token -> (expires, monotonic clock; client_email)
        self.exchanges: Counter[str] = Counter()
        self.refused = 0

    def exchange(self, form: dict[str, str], audiences: list[str], ttl: float) -> tuple[int, dict[str, Any]]:
        """Answer one grant: (status, body), Google's token endpoint's shapes."""
        if form.get("grant_type") != JWT_GRANT:
            self.refused += 1
            return 400, {"error": "unsupported_grant_type", "error_description": "Invalid grant_type."}
        try:
            claims = jwt.decode(form.get("assertion", ""), certs={VERTEX_KEY_ID: _public_key()},
                                audience=audiences, clock_skew_in_seconds=60)
            if claims["exp"] - claims["iat"] > 3600 or not claims.get("iss"):
                raise ValueError("the JWT must name its issuer and live at most an hour")
        except (ValueError, KeyError, TypeError, google_exceptions.GoogleAuthError) as exc:
            self.refused += 1
            return 400, {"error": "invalid_grant", "error_description": f"Invalid JWT: {exc}"}
        if CLOUD_PLATFORM not in str(claims.get("scope", "")).split():
            self.refused += 1
            return 400, {"error": "invalid_scope", "error_description": "Invalid OAuth scope provided."}
        email = str(claims["iss"])
        failure = parse_pairs((email_directives(email) or "sim:")[4:]).get("token_status", "")
        if failure.isdigit() and int(failure) >= 400:
            self.refused += 1
            error = "invalid_grant" if int(failure) < 500 else "internal_failure"
            return int(failure), {"error": error, "error_description": "simulated token exchange failure"}
        self.exchanges[email] += 1
        token = f"ya29.sim.{secrets.token_urlsafe(32)}"
        self._tokens[token] = (time.monotonic() + ttl, email)
        return 200, {"access_token": token, "expires_in": max(int(ttl), 0), "token_type": "Bearer"}

    def client_of(self, request: Request) -> str:
        """The client_email whose live token authorizes request; 401 otherwise."""
        auth = request.headers.get("authorization", "")
        held = self._tokens.get(auth[7:].strip()) if auth[:7].lower() == "bearer " else None
        if held is None:
            raise google_unauthenticated("Request had invalid authentication credentials. "
                                         "Expected OAuth 2 access token.")
        if time.monotonic() >= held[0]:
            raise google_unauthenticated("Request had invalid authentication credentials: the access token expired.")
        return held[1]

    def revoke(self) -> int:
        count = len(self._tokens)
        self._tokens.clear()
        return count

    def summary(self) -> dict[str, Any]:
        now = time.monotonic()
        return {"exchanges": sum(self.exchanges.values()), "refused": self.refused,
                "by_client": dict(self.exchanges), "live": sum(expires > now for expires, _ in self._tokens.values())}
