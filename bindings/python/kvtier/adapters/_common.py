"""Helpers shared by the engine adapters: configuration parsing and dtype names."""

from __future__ import annotations

import logging
from typing import Any, Mapping, Optional

import kvtier

logger = logging.getLogger("kvtier.adapters")

# Engine dtype spellings (torch, numpy, vLLM cache_dtype) -> kvtier dtype names.
_DTYPE_NAMES = {
    "bfloat16": "bf16",
    "bf16": "bf16",
    "float16": "fp16",
    "half": "fp16",
    "fp16": "fp16",
    "float32": "fp32",
    "float": "fp32",
    "fp32": "fp32",
    "float8_e4m3fn": "fp8_e4m3",
    "fp8": "fp8_e4m3",
    "fp8_e4m3": "fp8_e4m3",
}

def dtype_name(dtype: Any) -> str:
    """kvtier's name for an engine dtype: torch.bfloat16, 'bfloat16', numpy float16, 'fp8', ..."""
    name = str(getattr(dtype, "name", None) or dtype)
    name = name.replace("torch.", "").lower()
    try:
        return _DTYPE_NAMES[name]
    except KeyError:
        raise ValueError(
            f"kvtier: no kvtier dtype for engine dtype {dtype!r}; set 'dtype' in the adapter config "
            f"to one of bf16, fp16, fp32, fp8_e4m3"
        ) from None


def client_options(config: Mapping[str, Any]) -> kvtier.ClientOptions:
    """The kvtier.ClientOptions of an adapter config: every key that is a ClientOptions keyword
    (kvtier.ClientOptions.KEYWORDS: members, members_dns, dns_server, transport, tls_ca_file,
    tls_cert_file, tls_key_file, tls_server_name, auth_token, replication_factor, replication_overrides,
    rpc_timeout_ms, ...), plus ``auth_token_file``: a file holding the token (read once, surrounding
    whitespace stripped), which keeps the token off the engine's command line. The adapter's own keys
    are ignored here. Raises ValueError naming the key (kvtier.InvalidArgumentError for a bad value)."""
    options = {k: config[k] for k in config if k in kvtier.ClientOptions.KEYWORDS}
    token_file = config.get("auth_token_file")
    if token_file:
        if options.get("auth_token"):
            raise ValueError("kvtier: the adapter config has both 'auth_token' and 'auth_token_file'; give one")
        try:
            with open(token_file) as f:
                options["auth_token"] = f.read().strip()
        except OSError as e:
            raise ValueError(f"kvtier: auth_token_file: {e}") from None
        if not options["auth_token"]:
            raise ValueError(f"kvtier: auth_token_file: {token_file} is empty")
    if not options.get("members") and not options.get("members_dns"):
        raise ValueError("kvtier: the adapter config needs 'members' (['host:port', ...] or 'h:p,h:p') or "
                         "'members_dns' ('NAME:PORT')")
    return kvtier.ClientOptions(**options)


def connect(config: Mapping[str, Any]) -> kvtier.Client:
    """A Client from an adapter config (see client_options)."""
    return kvtier.Client(options=client_options(config))


def optional_str(config: Mapping[str, Any], key: str) -> Optional[str]:
    value = config.get(key)
    return None if value is None else str(value)
