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
- Durations are milliseconds (suffix _ms); sizes are bytes (suffix _bytes).
"""

from __future__ import annotations

from typing import Any, ClassVar, Dict, List, Mapping, Optional, Sequence, Tuple, Union

import numpy as np
import numpy.typing as npt

_Bytes = Union[bytes, bytearray, memoryview]
_FingerprintsIn = Union[Sequence[Union[_Bytes, str, npt.NDArray[np.uint8]]], _Bytes, npt.NDArray[np.uint8]]
_BufferIn = Any  # buffer-protocol object or DLPack producer (see the module docstring)
_BuffersIn = Union[Sequence[_BufferIn], _BufferIn]
_TokensIn = Union[Sequence[int], npt.NDArray[np.integer]]

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
        members: Union[Sequence[str], str],  # "host:port" / "node_id=host:port", or comma-separated
        *,
        rpc_timeout_ms: int = 2000,
        connect_timeout_ms: int = 5000,
        max_message_bytes: int = 80 << 20,
        stream_chunk_bytes: int = 1 << 20,
        max_blocks_per_request: int = 4096,
        put_batch_blocks: int = 64,
        virtual_nodes: int = 1024,
    ) -> None: ...
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
    ) -> List[PutResult]:
        """Store shard `shard` of n blocks; first_block_index = index of fingerprints[0] in its chain."""
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
    ) -> List[PutResult]: ...
    def stats(self) -> Dict[str, int]: ...
    def members(self) -> List[Dict[str, Union[str, bool]]]: ...
    def close(self) -> None: ...
    @property
    def closed(self) -> bool: ...
    def __enter__(self) -> Client: ...
    def __exit__(self, *args: Any) -> bool: ...
