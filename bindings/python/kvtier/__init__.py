"""kvtier: a distributed KV-cache tier for LLM inference (Python client).

Blocks of KV cache are named by fingerprints (a SHA-256 chain over the token ids of each block and all
blocks before it, scoped to a Namespace) and stored across the members of a kvtier cluster.

    import numpy as np, kvtier

    ns = kvtier.Namespace("acme", "meta-llama/Llama-3.1-8B", revision="main",
                          num_layers=32, num_kv_heads=8, head_dim=128, block_tokens=16, dtype="bf16")
    with kvtier.Client(["127.0.0.1:7000", "127.0.0.1:7001"]) as client:
        fps = kvtier.fingerprints(ns, prompt_token_ids)          # len(prompt) // 16 fingerprints
        hit = client.lookup(ns, fps)                             # leading blocks cached
        kv = np.empty((hit, 32, 2, 16, 8, 128), np.uint16)       # bf16 held as uint16
        results = client.get(ns, fps[:hit], kv)                  # one GetResult per block
        kvtier.leading_hits(results)                             # blocks usable from the start

Units: sizes are bytes; durations are seconds (int or float) or datetime.timedelta, and keywords with
the suffix _ms take milliseconds; token counts are tokens. Block shapes are in KvLayout's docstring.
Client(...) and ClientOptions(...) take every option of the C++ client by its name (ClientOptions.FIELDS):
TLS, tokens, DNS membership, transport, replication. Engine adapters live in kvtier.adapters (SGLang HiCache storage, vLLM KV
connector). The C++ extension releases the GIL while it waits on the network.
"""

from typing import Iterable

from ._kvtier import (  # noqa: F401  (re-exported)
    EVENT_SUBSCRIBER_OPTIONS,
    GROUP_KEY_BLOCKS,
    Client,
    ClientOptions,
    Error,
    EventSubscriber,
    GetResult,
    InvalidArgumentError,
    KvLayout,
    LookupResult,
    LshBands,
    MinHasher,
    Namespace,
    PutResult,
    ReplicationOverride,
    SimilarityIndex,
    UnavailableError,
    choose_lsh_bands,
    external_key_fingerprints,
    fingerprints,
    items_from_fingerprints,
    items_from_tokens,
    prompt_group_key,
)

__all__ = [
    "EVENT_SUBSCRIBER_OPTIONS",
    "GROUP_KEY_BLOCKS",
    "Client",
    "ClientOptions",
    "Error",
    "EventSubscriber",
    "GetResult",
    "InvalidArgumentError",
    "KvLayout",
    "LookupResult",
    "LshBands",
    "MinHasher",
    "Namespace",
    "PutResult",
    "ReplicationOverride",
    "SimilarityIndex",
    "UnavailableError",
    "choose_lsh_bands",
    "external_key_fingerprints",
    "fingerprints",
    "items_from_fingerprints",
    "items_from_tokens",
    "prompt_group_key",
    "leading_hits",
    "reusable_tokens",
]

__version__ = "0.1.0"


def leading_hits(results: Iterable[GetResult]) -> int:
    """Number of leading GetResult.HIT entries: the blocks of a get() usable as a prefix.

    A block after the first non-hit cannot be used even if it arrived, because its KV depends on the
    missing block before it.
    """
    n = 0
    for r in results:
        if r != GetResult.HIT:
            break
        n += 1
    return n


def reusable_tokens(hit_blocks: int, block_tokens: int, prompt_tokens: int, *, keep_last: int = 1) -> int:
    """Tokens an engine may skip: hit_blocks * block_tokens, capped so that at least `keep_last` prompt
    tokens are still computed (engines need the last token's logits), rounded down to whole blocks.

    Always a multiple of block_tokens, and never more than prompt_tokens - keep_last:
        reusable_tokens(4, 16, 64) == 48     # a fully cached 64-token prompt recomputes its last block
        reusable_tokens(4, 16, 65) == 64
    """
    if block_tokens <= 0:
        raise ValueError(f"block_tokens must be > 0, got {block_tokens}")
    if hit_blocks < 0 or prompt_tokens < 0 or keep_last < 0:
        raise ValueError("hit_blocks, prompt_tokens and keep_last must be >= 0")
    cap = max(prompt_tokens - keep_last, 0) // block_tokens
    return min(hit_blocks, cap) * block_tokens
