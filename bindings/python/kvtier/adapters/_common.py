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

# Client options an adapter's configuration may carry (the rest of Client's keywords).
_CLIENT_OPTIONS = (
    "rpc_timeout_ms",
    "connect_timeout_ms",
    "max_message_bytes",
    "stream_chunk_bytes",
    "max_blocks_per_request",
    "put_batch_blocks",
    "virtual_nodes",
)


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


def connect(config: Mapping[str, Any]) -> kvtier.Client:
    """A Client from an adapter config: 'members' (list or comma-separated str) plus any Client option."""
    members = config.get("members")
    if not members:
        raise ValueError("kvtier: the adapter config needs 'members' (['host:port', ...] or 'h:p,h:p')")
    options = {k: int(config[k]) for k in _CLIENT_OPTIONS if k in config}
    return kvtier.Client(members, **options)


def optional_str(config: Mapping[str, Any], key: str) -> Optional[str]:
    value = config.get(key)
    return None if value is None else str(value)
