"""Type stubs of kvtier._kvtier, the C++ extension that the `kvtier` package re-exports.

Shapes and units
- A fingerprint is 32 bytes. "Fingerprints" arguments accept a list of 32-byte values (bytes,
  bytearray, memoryview, numpy rows, or 64-character hex str) or one buffer of 32 * n bytes, such as
  the uint8 array of shape [n, 32] that fingerprints(..., as_numpy=True) returns.
- A block (one TP shard of it) is Namespace.block_bytes bytes. For the standard layout kind it is,
  row-major, [num_layers, 2 (K, V), block_tokens, num_kv_heads // tp_size, head_dim] elements of dtype
  (bf16 may be held as uint16 in numpy); for the MLA kind [num_layers, block_tokens, latent_dim].
- "Buffers" arguments accept a list of n host buffers of exactly block_bytes each, or one buffer of
  n * block_bytes bytes (e.g. numpy [n, num_layers, 2, block_tokens, heads, head_dim]). Objects may use
  the buffer protocol (numpy, bytearray, memoryview; bytes for put only) or DLPack (__dlpack__ on CPU,
  pinned or managed memory, e.g. CPU torch tensors). They must be C-contiguous; get() needs them
  writable. They are borrowed for the call only.
- Durations are seconds (int or float) or datetime.timedelta; each duration option `x` also takes
  `x_ms` in milliseconds (one of the two). Sizes are bytes (suffix _bytes).
- Client and ClientOptions take every field of the C++ ClientOptions (kvtier/client/client.h) as a
  keyword, by the same name; ClientOptions.FIELDS lists them. tests/python/test_client_options.py checks
  that this stub lists every one of them.
"""

from __future__ import annotations

import datetime
import os
from typing import Any, ClassVar, Dict, FrozenSet, Iterable, List, Mapping, Optional, Sequence, Tuple, Union

import numpy as np
import numpy.typing as npt

_Bytes = Union[bytes, bytearray, memoryview]
_FingerprintsIn = Union[Sequence[Union[_Bytes, str, npt.NDArray[np.uint8]]], _Bytes, npt.NDArray[np.uint8]]
_BufferIn = Any  # buffer-protocol object or DLPack producer (see the module docstring)
_BuffersIn = Union[Sequence[_BufferIn], _BufferIn]
_TokensIn = Union[Sequence[int], npt.NDArray[np.integer]]
_ItemsIn = Union[Sequence[int], npt.NDArray[np.uint64], npt.NDArray[np.int64]]  # 64-bit items
_Duration = Union[float, int, datetime.timedelta]  # seconds, or a timedelta
_Str = Union[str, os.PathLike]
_MembersIn = Union[Sequence[str], str]  # "host:port" / "node_id=host:port", or comma-separated

class Error(RuntimeError):
    """A kvtier call failed."""

    code: int  # absl / gRPC status number
    code_name: str  # e.g. "FAILED_PRECONDITION"

class InvalidArgumentError(Error, ValueError):
    """A bad argument (INVALID_ARGUMENT); the message names it."""

class UnavailableError(Error, ConnectionError):
    """No member could be reached (UNAVAILABLE); retrying may succeed."""

# GetResult and PutResult are pybind11 enums, not enum.IntEnum: their members are not ints (isinstance
# (GetResult.HIT, int) is False) and support no arithmetic. They do act as ints where results are
# checked: they compare with ints by value (GetResult.HIT == 0, GetResult.MISS > 0), hash as their
# value (so {0: ...}[GetResult.HIT] works), and convert with int() and operator.index(). A member never
# equals a member of the other enum (GetResult.HIT != PutResult.STORED).

class GetResult:
    """Outcome of one block of Client.get."""

    HIT: ClassVar[GetResult]  # 0: bytes arrived and matched their checksum
    MISS: ClassVar[GetResult]  # 1: the owner does not hold the block
    MISS_FROM_ERROR: ClassVar[GetResult]  # 2: the owner failed, timed out or was unreachable (counted)
    CHECKSUM_MISMATCH: ClassVar[GetResult]  # 3: bytes arrived corrupted and were discarded
    __members__: ClassVar[Dict[str, GetResult]]
    def __init__(self, value: int) -> None: ...
    @property
    def name(self) -> str: ...
    @property
    def value(self) -> int: ...
    def __int__(self) -> int: ...
    def __index__(self) -> int: ...
    def __hash__(self) -> int: ...
    def __eq__(self, other: object) -> bool: ...
    def __ne__(self, other: object) -> bool: ...
    def __lt__(self, other: Union[GetResult, int]) -> bool: ...
    def __le__(self, other: Union[GetResult, int]) -> bool: ...
    def __gt__(self, other: Union[GetResult, int]) -> bool: ...
    def __ge__(self, other: Union[GetResult, int]) -> bool: ...

class PutResult:
    """Outcome of one block of Client.put."""

    STORED: ClassVar[PutResult]  # 0: committed by this call
    ALREADY_PRESENT: ClassVar[PutResult]  # 1: the owner had it; its recency was refreshed
    IN_PROGRESS: ClassVar[PutResult]  # 2: another writer is storing it now
    NO_SPACE: ClassVar[PutResult]  # 3: the owner had nothing evictable
    ERROR: ClassVar[PutResult]  # 4: the owner failed, timed out or was unreachable (counted)
    __members__: ClassVar[Dict[str, PutResult]]
    def __init__(self, value: int) -> None: ...
    @property
    def name(self) -> str: ...
    @property
    def value(self) -> int: ...
    def __int__(self) -> int: ...
    def __index__(self) -> int: ...
    def __hash__(self) -> int: ...
    def __eq__(self, other: object) -> bool: ...
    def __ne__(self, other: object) -> bool: ...
    def __lt__(self, other: Union[PutResult, int]) -> bool: ...
    def __le__(self, other: Union[PutResult, int]) -> bool: ...
    def __gt__(self, other: Union[PutResult, int]) -> bool: ...
    def __ge__(self, other: Union[PutResult, int]) -> bool: ...

class KvLayout:
    """What one stored block holds. KvLayout(**fields); see the module docstring for the shape."""

    def __init__(
        self,
        *,
        kind: str = "standard",  # "standard" | "mla"
        dtype: str = "bf16",  # "bf16" | "fp16" | "fp32" | "fp8_e4m3"
        codec: str = "none",  # "none" | "fp8_e4m3" | "int8"
        num_layers: int = 0,  # required, > 0
        num_kv_heads: int = 0,  # standard kind: the whole model's KV heads, divisible by tp_size
        head_dim: int = 0,  # standard kind: elements per head
        latent_dim: int = 0,  # MLA kind: elements per token and layer
        block_tokens: int = 16,  # tokens per block
        tp_size: int = 1,  # shards per block
        quant_group_size: int = 64,  # values per fp32 scale when codec != "none"
    ) -> None: ...
    @property
    def kind(self) -> str: ...
    @property
    def dtype(self) -> str: ...
    @property
    def codec(self) -> str: ...
    @property
    def num_layers(self) -> int: ...
    @property
    def num_kv_heads(self) -> int: ...
    @property
    def head_dim(self) -> int: ...
    @property
    def latent_dim(self) -> int: ...
    @property
    def block_tokens(self) -> int: ...
    @property
    def tp_size(self) -> int: ...
    @property
    def quant_group_size(self) -> int: ...
    @property
    def block_bytes(self) -> int:
        """Bytes of one TP shard of one block."""
    def to_dict(self) -> Dict[str, Union[int, str]]: ...

class Namespace:
    """Tenant, model, revision and KV layout: the scope within which requests share KV."""

    def __init__(
        self,
        tenant: str,  # 1..255 bytes
        model: str,  # 1..255 bytes
        revision: Optional[str] = None,  # None (absent) differs from ""
        *,
        layout: Union[KvLayout, Mapping[str, Union[int, str]], None] = None,
        tenant_salt: Union[str, bytes, None] = None,  # secret, never sent to servers
        **layout_fields: Union[int, str],  # applied on top of `layout`
    ) -> None: ...
    @property
    def tenant(self) -> str: ...
    @property
    def model(self) -> str: ...
    @property
    def revision(self) -> Optional[str]: ...
    @property
    def layout(self) -> KvLayout: ...
    @property
    def has_tenant_salt(self) -> bool: ...
    @property
    def block_bytes(self) -> int:
        """Bytes of one TP shard of one block: the size of every get/put buffer."""
    @property
    def block_tokens(self) -> int: ...
    @property
    def tp_size(self) -> int: ...
    @property
    def id(self) -> int:
        """64-bit id, equal for equal namespaces on every machine."""
    def canonical_bytes(self) -> bytes: ...

class ReplicationOverride:
    """A per-namespace replication factor: the first entry with the namespace's tenant and its model (or
    model "": every model of the tenant) wins."""

    def __init__(self, tenant: str, model: str = "", replication_factor: int = 1) -> None: ...
    @property
    def tenant(self) -> str: ...
    @property
    def model(self) -> str: ...
    @property
    def replication_factor(self) -> int: ...
    def to_dict(self) -> Dict[str, Union[str, int]]: ...

_OverrideIn = Union[ReplicationOverride, Mapping[str, Union[str, int]], Tuple[Any, ...]]

class ClientOptions:
    """Every option of the C++ client, validated (TypeError for an unknown option or a wrong type,
    InvalidArgumentError naming the field for a bad value). None leaves a field at its default."""

    FIELDS: ClassVar[Tuple[str, ...]]  # every ClientOptions field, in declaration order
    KEYWORDS: ClassVar[FrozenSet[str]]  # FIELDS plus `<duration>_ms`
    def __init__(
        self,
        members: Optional[_MembersIn] = None,
        *,
        members_dns: Optional[_Str] = '',
        dns_server: Optional[_Str] = '',
        dns_refresh_interval: Optional[_Duration] = 5.0,
        dns_refresh_interval_ms: Optional[float] = None,
        dns_timeout: Optional[_Duration] = 2.0,
        dns_timeout_ms: Optional[float] = None,
        health_check_interval: Optional[_Duration] = 1.0,
        health_check_interval_ms: Optional[float] = None,
        health_check_timeout: Optional[_Duration] = 1.0,
        health_check_timeout_ms: Optional[float] = None,
        unhealthy_threshold: Optional[int] = 3,
        healthy_threshold: Optional[int] = 2,
        virtual_nodes: Optional[int] = 1024,
        rpc_timeout: Optional[_Duration] = 2.0,
        rpc_timeout_ms: Optional[float] = None,
        connect_timeout: Optional[_Duration] = 5.0,
        connect_timeout_ms: Optional[float] = None,
        max_message_bytes: Optional[int] = 80 << 20,
        stream_chunk_bytes: Optional[int] = 1 << 20,
        max_blocks_per_request: Optional[int] = 4096,
        put_batch_blocks: Optional[int] = 64,
        max_block_bytes: Optional[int] = 64 << 20,
        transport: Optional[_Str] = 'auto',
        ucx_transports: Optional[_Str] = '',
        ucx_reconnect_backoff: Optional[_Duration] = 1.0,
        ucx_reconnect_backoff_ms: Optional[float] = None,
        ucx_get_lanes: Optional[int] = 2,
        tls_ca_file: Optional[_Str] = '',
        tls_cert_file: Optional[_Str] = '',
        tls_key_file: Optional[_Str] = '',
        tls_server_name: Optional[_Str] = '',
        auth_token: Optional[_Str] = '',
        replication_factor: Optional[int] = 1,
        replication_overrides: Optional[Sequence[_OverrideIn]] = (),
        hot_read_replicas: Optional[int] = 0,
        hot_depth: Optional[int] = 4,
        replica_queue_bytes: Optional[int] = 256 << 20,
        hint_queue_bytes: Optional[int] = 256 << 20,
        hint_retry_interval: Optional[_Duration] = 1.0,
        hint_retry_interval_ms: Optional[float] = None,
    ) -> None: ...
    @property
    def members(self) -> List[str]: ...
    @property
    def members_dns(self) -> str: ...
    @property
    def dns_server(self) -> str: ...
    @property
    def dns_refresh_interval(self) -> float: ...  # seconds
    @property
    def dns_timeout(self) -> float: ...  # seconds
    @property
    def health_check_interval(self) -> float: ...  # seconds
    @property
    def health_check_timeout(self) -> float: ...  # seconds
    @property
    def unhealthy_threshold(self) -> int: ...
    @property
    def healthy_threshold(self) -> int: ...
    @property
    def virtual_nodes(self) -> int: ...
    @property
    def rpc_timeout(self) -> float: ...  # seconds
    @property
    def connect_timeout(self) -> float: ...  # seconds
    @property
    def max_message_bytes(self) -> int: ...
    @property
    def stream_chunk_bytes(self) -> int: ...
    @property
    def max_blocks_per_request(self) -> int: ...
    @property
    def put_batch_blocks(self) -> int: ...
    @property
    def max_block_bytes(self) -> int: ...
    @property
    def transport(self) -> str: ...
    @property
    def ucx_transports(self) -> str: ...
    @property
    def ucx_reconnect_backoff(self) -> float: ...  # seconds
    @property
    def ucx_get_lanes(self) -> int: ...
    @property
    def tls_ca_file(self) -> str: ...
    @property
    def tls_cert_file(self) -> str: ...
    @property
    def tls_key_file(self) -> str: ...
    @property
    def tls_server_name(self) -> str: ...
    @property
    def auth_token(self) -> str: ...
    @property
    def replication_factor(self) -> int: ...
    @property
    def replication_overrides(self) -> List[Dict[str, Union[str, int]]]: ...
    @property
    def hot_read_replicas(self) -> int: ...
    @property
    def hot_depth(self) -> int: ...
    @property
    def replica_queue_bytes(self) -> int: ...
    @property
    def hint_queue_bytes(self) -> int: ...
    @property
    def hint_retry_interval(self) -> float: ...  # seconds
    def to_dict(self) -> Dict[str, Any]: ...  # ClientOptions(**o.to_dict()) == o
    def __eq__(self, other: object) -> bool: ...

class LookupResult:
    @property
    def prefix_blocks(self) -> int: ...
    @property
    def prefix_tokens(self) -> int: ...  # prefix_blocks * block_tokens
    @property
    def present(self) -> List[bool]: ...
    @property
    def blocks_from_errors(self) -> int: ...

def fingerprints(
    ns: Namespace,
    tokens: _TokensIn,
    *,
    lora: Union[Tuple[str, int], Mapping[str, Any], str, None] = None,  # (adapter_id, version)
    cache_salt: Union[str, bytes, None] = None,  # hashed into block 0 only
    multimodal: Optional[Sequence[Tuple[Union[str, bytes], int, int]]] = None,  # (hash, offset, length)
    as_numpy: bool = False,
) -> Union[List[bytes], npt.NDArray[np.uint8]]:
    """len(tokens) // ns.block_tokens fingerprints (list of 32-byte bytes, or uint8 [n, 32])."""

def external_key_fingerprints(
    ns: Namespace, keys: Sequence[Union[str, bytes]], *, as_numpy: bool = False
) -> Union[List[bytes], npt.NDArray[np.uint8]]:
    """One fingerprint per engine-chosen key (each key must already name a whole prefix)."""

class Client:
    """A connection to a kvtier cluster; thread-safe; releases the GIL during I/O."""

    def __init__(
        self,
        members: Optional[_MembersIn] = None,
        *,
        options: Optional[ClientOptions] = None,  # the base; members and the keywords apply on top
        members_dns: Optional[_Str] = '',
        dns_server: Optional[_Str] = '',
        dns_refresh_interval: Optional[_Duration] = 5.0,
        dns_refresh_interval_ms: Optional[float] = None,
        dns_timeout: Optional[_Duration] = 2.0,
        dns_timeout_ms: Optional[float] = None,
        health_check_interval: Optional[_Duration] = 1.0,
        health_check_interval_ms: Optional[float] = None,
        health_check_timeout: Optional[_Duration] = 1.0,
        health_check_timeout_ms: Optional[float] = None,
        unhealthy_threshold: Optional[int] = 3,
        healthy_threshold: Optional[int] = 2,
        virtual_nodes: Optional[int] = 1024,
        rpc_timeout: Optional[_Duration] = 2.0,
        rpc_timeout_ms: Optional[float] = None,
        connect_timeout: Optional[_Duration] = 5.0,
        connect_timeout_ms: Optional[float] = None,
        max_message_bytes: Optional[int] = 80 << 20,
        stream_chunk_bytes: Optional[int] = 1 << 20,
        max_blocks_per_request: Optional[int] = 4096,
        put_batch_blocks: Optional[int] = 64,
        max_block_bytes: Optional[int] = 64 << 20,
        transport: Optional[_Str] = 'auto',
        ucx_transports: Optional[_Str] = '',
        ucx_reconnect_backoff: Optional[_Duration] = 1.0,
        ucx_reconnect_backoff_ms: Optional[float] = None,
        ucx_get_lanes: Optional[int] = 2,
        tls_ca_file: Optional[_Str] = '',
        tls_cert_file: Optional[_Str] = '',
        tls_key_file: Optional[_Str] = '',
        tls_server_name: Optional[_Str] = '',
        auth_token: Optional[_Str] = '',
        replication_factor: Optional[int] = 1,
        replication_overrides: Optional[Sequence[_OverrideIn]] = (),
        hot_read_replicas: Optional[int] = 0,
        hot_depth: Optional[int] = 4,
        replica_queue_bytes: Optional[int] = 256 << 20,
        hint_queue_bytes: Optional[int] = 256 << 20,
        hint_retry_interval: Optional[_Duration] = 1.0,
        hint_retry_interval_ms: Optional[float] = None,
    ) -> None: ...
    @property
    def options(self) -> ClientOptions: ...
    def fingerprints(
        self,
        ns: Namespace,
        tokens: _TokensIn,
        *,
        lora: Union[Tuple[str, int], Mapping[str, Any], str, None] = None,
        cache_salt: Union[str, bytes, None] = None,
        multimodal: Optional[Sequence[Tuple[Union[str, bytes], int, int]]] = None,
        as_numpy: bool = False,
    ) -> Union[List[bytes], npt.NDArray[np.uint8]]: ...
    def lookup(self, ns: Namespace, fingerprints: _FingerprintsIn) -> int:
        """Leading blocks present on every TP shard (reusable tokens = this * ns.block_tokens)."""
    def lookup_detail(self, ns: Namespace, fingerprints: _FingerprintsIn) -> LookupResult: ...
    def get(self, ns: Namespace, fingerprints: _FingerprintsIn, buffers: _BuffersIn, shard: int = 0) -> List[GetResult]:
        """Fetch shard `shard` of n blocks into writable host buffers; only HIT buffers are valid."""
    def put(
        self,
        ns: Namespace,
        fingerprints: _FingerprintsIn,
        buffers: _BuffersIn,
        shard: int = 0,
        first_block_index: int = 0,
        *,
        block_hashes: Optional[Sequence[Union[int, bytes]]] = None,  # the engine's hash of each block
        token_ids: Optional[Sequence[Optional[Sequence[int]]]] = None,  # each block's tokens, <= 1024
        lora_id: Optional[int] = None,
        parent_hash: Optional[Union[int, bytes]] = None,  # engine hash of the block before fingerprints[0]
        parent_fingerprint: Optional[Union[bytes, str]] = None,  # kvtier fingerprint of that block
    ) -> List[PutResult]:
        """Store shard `shard` of n blocks; first_block_index = index of fingerprints[0] in its chain.
        The engine metadata is kept with the blocks and published in KV events (docs/events.md)."""
    def get_ptrs(
        self,
        ns: Namespace,
        fingerprints: _FingerprintsIn,
        ptrs: Sequence[int],  # host addresses, k segments per block
        sizes: Union[Sequence[int], int],  # bytes per segment (per block they sum to block_bytes)
        shard: int = 0,
    ) -> List[GetResult]: ...
    def put_ptrs(
        self,
        ns: Namespace,
        fingerprints: _FingerprintsIn,
        ptrs: Sequence[int],
        sizes: Union[Sequence[int], int],
        shard: int = 0,
        first_block_index: int = 0,
        *,
        block_hashes: Optional[Sequence[Union[int, bytes]]] = None,  # as put()
        token_ids: Optional[Sequence[Optional[Sequence[int]]]] = None,
        lora_id: Optional[int] = None,
        parent_hash: Optional[Union[int, bytes]] = None,
        parent_fingerprint: Optional[Union[bytes, str]] = None,
    ) -> List[PutResult]: ...
    def stats(self) -> Dict[str, int]: ...  # every ClientStats counter
    def stats_info(self) -> List[Dict[str, Any]]: ...  # [{name, value, help, kind}] of every counter
    def members(self) -> List[Dict[str, Union[str, bool, int]]]: ...
    # one dict per member: address, node_id, ok, code, error, counters {name: int}, kinds {name: kind}
    def server_stats(self, timeout: _Duration = 5.0) -> List[Dict[str, Any]]: ...
    def flush_replicas(self, timeout: _Duration = 10.0) -> None: ...
    def close(self) -> None: ...
    @property
    def closed(self) -> bool: ...
    def __enter__(self) -> Client: ...
    def __exit__(self, *args: Any) -> bool: ...

class EventSubscriber:
    """Follows the KV events of many servers (docs/events.md): an index of which node holds which blocks."""

    def __init__(
        self,
        members: _MembersIn,  # the servers' gRPC addresses
        *,
        rpc_timeout: Optional[_Duration] = 5.0,
        rpc_timeout_ms: Optional[float] = None,
        retry_interval: Optional[_Duration] = 1.0,
        retry_interval_ms: Optional[float] = None,
        receive_hwm: Optional[int] = 100000,
        max_message_bytes: Optional[int] = 80 << 20,
        tls_ca_file: Optional[_Str] = "",
        tls_cert_file: Optional[_Str] = "",
        tls_key_file: Optional[_Str] = "",
        tls_server_name: Optional[_Str] = "",
        auth_token: Optional[_Str] = "",  # an admin token on servers with auth
    ) -> None: ...
    def wait_for_catch_up(self, timeout: _Duration = 10.0) -> None: ...
    def nodes_holding(self, fingerprint: Union[_Bytes, str], shard: int = 0) -> List[str]: ...
    def prefix_match(
        self, ns: Union[Namespace, int], fingerprints: _FingerprintsIn, shard: int = 0
    ) -> List[Tuple[str, int]]: ...  # (node_id, leading blocks held), longest first
    def blocks_of(self, node_id: str) -> List[Dict[str, Union[bytes, int, str]]]: ...
    def nodes(self) -> List[Dict[str, Union[str, int, bool]]]: ...
    def stats(self) -> Dict[str, int]: ...
    def pause(self) -> None: ...
    def resume(self) -> None: ...
    def close(self) -> None: ...
    @property
    def closed(self) -> bool: ...
    def __enter__(self) -> EventSubscriber: ...
    def __exit__(self, *args: Any) -> bool: ...

EVENT_SUBSCRIBER_OPTIONS: List[str]  # the keywords of EventSubscriber

class LshBands:
    def __init__(self, bands: int, rows: int) -> None: ...
    @property
    def bands(self) -> int: ...
    @property
    def rows(self) -> int: ...
    def collision_probability(self, s: float) -> float: ...
    def approximate_threshold(self) -> float: ...

def choose_lsh_bands(threshold: float = 0.85, num_hashes: int = 128) -> LshBands: ...

class MinHasher:
    """MinHash signatures, LSH band keys and affinity keys of 64-bit item sequences (DESIGN.md §7)."""

    def __init__(
        self, *, threshold: float = 0.85, num_hashes: int = 128, shingle_size: int = 1, seed: int = 0
    ) -> None: ...
    @property
    def threshold(self) -> float: ...
    @property
    def num_hashes(self) -> int: ...
    @property
    def shingle_size(self) -> int: ...
    @property
    def seed(self) -> int: ...
    @property
    def bands(self) -> LshBands: ...
    def signature(self, items: _ItemsIn) -> List[int]: ...
    def band_keys(self, signature: _ItemsIn) -> List[int]: ...
    def band_keys_of(self, items: _ItemsIn) -> List[int]: ...
    def affinity_key(self, items: _ItemsIn) -> int: ...

def items_from_fingerprints(fingerprints: _FingerprintsIn) -> List[int]: ...
def items_from_tokens(tokens: _TokensIn) -> List[int]: ...
def prompt_group_key(fingerprints: _FingerprintsIn) -> int: ...  # the key servers count lookups under

GROUP_KEY_BLOCKS: int  # prompt_group_key reads at most this many leading fingerprints

class SimilarityIndex:
    """A bounded LSH table that assigns group ids; thread-safe."""

    def __init__(self, capacity_keys: int = 1 << 20) -> None: ...
    def assign(self, band_keys: _ItemsIn) -> int: ...
    def __len__(self) -> int: ...
