/*
 * kvtier C API: find, fetch and store KV-cache blocks in a kvtier cluster from C, or from any language
 * with a C FFI (DESIGN.md §5). A thin layer over the C++ client (kvtier/client/client.h); the semantics
 * (prefix lookup, per-block results, misses from errors) are the C++ client's.
 *
 * Link: -lkvtier (libkvtier.so exports only the kvtier_* symbols below). C99 or later; C++ may include it.
 *
 * Conventions
 *  - Every fallible function returns a kvtier_status_code; KVTIER_OK (0) is success. The codes are
 *    absl::StatusCode's (and gRPC's) numbers, so callers can choose what to do by code:
 *    UNAVAILABLE = retry the call, ABORTED = retry the operation, FAILED_PRECONDITION = do not retry,
 *    RESOURCE_EXHAUSTED = out of capacity, INVALID_ARGUMENT = a bug in the caller.
 *  - Messages: pass a kvtier_error_t* to get the code and message of that call (may be NULL), or call
 *    kvtier_last_error_message() afterwards. The latter is thread-local and describes the most recent
 *    call on this thread that returned a code (empty after a success).
 *  - Cache misses are not errors: they are per-block results (kvtier_get_result). A dead or slow server
 *    turns into KVTIER_GET_MISS_FROM_ERROR / KVTIER_PUT_ERROR within rpc_timeout_ms, never into a hang
 *    or an error code. A server's refusal of the request itself is the call's error, with the
 *    server's code and its message after the member and the RPC ("member node-1 (10.0.0.1:7400)
 *    refused Allocate: namespace.layout: a block is 2097152 bytes, this server accepts at most
 *    1048576"): INVALID_ARGUMENT (e.g. a block above that server's limits.max_block_bytes),
 *    PERMISSION_DENIED (the token's tenant is not the namespace's), UNAUTHENTICATED (no or an unknown
 *    token). Retrying such a call, or asking another server, gives the same answer. Which answers are
 *    which: kvtier/client/client.h, "Errors", on class Client.
 *  - Ownership: handles come from kvtier_namespace_create and kvtier_client_connect and are released
 *    by kvtier_namespace_free and kvtier_client_close (which accept and ignore NULL). Every pointer
 *    argument is borrowed for the duration of the call only.
 *  - Thread-safety: a kvtier_client_t may be used from many threads at once. A kvtier_namespace_t is
 *    immutable after creation (kvtier_namespace_set_tenant_salt must happen before it is shared).
 *  - Units: sizes are bytes (uint64_t, suffix _bytes); durations are milliseconds (suffix _ms).
 *  - Fingerprints are 32-byte values (KVTIER_FINGERPRINT_BYTES); arrays of them are packed back to
 *    back: fingerprint i occupies bytes [32*i, 32*i + 32).
 *
 * Structs that carry a struct_size field are versioned: call the matching *_init() first, which sets
 * struct_size and every default, then change the fields you need (or set struct_size = sizeof yourself
 * where a struct has no *_init()). Later releases only append fields, and the library reads (or writes)
 * only the fields that the caller's struct_size covers, so programs built against an older kvtier.h
 * keep working with a newer libkvtier.
 */
#ifndef KVTIER_KVTIER_H_
#define KVTIER_KVTIER_H_

#include <stddef.h>
#include <stdint.h>

#if defined(__GNUC__)
#define KVTIER_API __attribute__((visibility("default")))
#else
#define KVTIER_API
#endif

#ifdef __cplusplus
extern "C" {
#endif

#define KVTIER_FINGERPRINT_BYTES 32
#define KVTIER_ERROR_MESSAGE_BYTES 512

/* Status codes: the numbers of absl::StatusCode (and grpc::StatusCode). */
typedef enum kvtier_status_code {
  KVTIER_OK = 0,
  KVTIER_CANCELLED = 1,
  KVTIER_UNKNOWN = 2,
  KVTIER_INVALID_ARGUMENT = 3,
  KVTIER_DEADLINE_EXCEEDED = 4,
  KVTIER_NOT_FOUND = 5,
  KVTIER_ALREADY_EXISTS = 6,
  KVTIER_PERMISSION_DENIED = 7,
  KVTIER_RESOURCE_EXHAUSTED = 8,
  KVTIER_FAILED_PRECONDITION = 9,
  KVTIER_ABORTED = 10,
  KVTIER_OUT_OF_RANGE = 11,
  KVTIER_UNIMPLEMENTED = 12,
  KVTIER_INTERNAL = 13,
  KVTIER_UNAVAILABLE = 14,
  KVTIER_DATA_LOSS = 15,
  KVTIER_UNAUTHENTICATED = 16
} kvtier_status_code;

/* The outcome of one call: its code and a NUL-terminated message (truncated to fit; "" on success). */
typedef struct kvtier_error {
  kvtier_status_code code;
  char message[KVTIER_ERROR_MESSAGE_BYTES];
} kvtier_error_t;

/* Upper-case name of a code ("INVALID_ARGUMENT"); "UNKNOWN_CODE" for numbers outside the enum.
 * The string is static. */
KVTIER_API const char* kvtier_status_code_name(kvtier_status_code code);
/* Message of the most recent call on this thread that returned a status code ("" after a success).
 * Valid until the next kvtier_* call on this thread. */
KVTIER_API const char* kvtier_last_error_message(void);
/* Code of that same call. */
KVTIER_API kvtier_status_code kvtier_last_error_code(void);
/* The library version, e.g. "0.1.0". Static string. */
KVTIER_API const char* kvtier_version(void);

/* ---------------------------------------------------------------------------------------------- */
/* Layouts and namespaces (DESIGN.md §1: blocks are shared only within one namespace).              */

typedef enum kvtier_layout_kind { KVTIER_LAYOUT_STANDARD = 1, KVTIER_LAYOUT_MLA = 2 } kvtier_layout_kind;
typedef enum kvtier_dtype {
  KVTIER_DTYPE_FP16 = 1,
  KVTIER_DTYPE_BF16 = 2,
  KVTIER_DTYPE_FP32 = 3,
  KVTIER_DTYPE_FP8_E4M3 = 4
} kvtier_dtype;
typedef enum kvtier_codec { KVTIER_CODEC_NONE = 0, KVTIER_CODEC_FP8_E4M3 = 1, KVTIER_CODEC_INT8 = 2 } kvtier_codec;

/* What one stored block holds. One TP shard of a block of the standard kind is, row-major,
 *   [num_layers][2 (K,V)][block_tokens][num_kv_heads / tp_size][head_dim] elements of dtype
 * (1-byte elements plus fp32 scales for a quantized codec); the MLA kind is
 *   [num_layers][block_tokens][latent_dim]. kvtier_namespace_block_bytes() gives the byte count. */
typedef struct kvtier_kv_layout {
  uint32_t struct_size;      /* set by kvtier_kv_layout_init() */
  kvtier_layout_kind kind;   /* Default: KVTIER_LAYOUT_STANDARD */
  kvtier_dtype dtype;        /* Default: KVTIER_DTYPE_BF16 */
  kvtier_codec codec;        /* Default: KVTIER_CODEC_NONE */
  uint32_t num_layers;       /* required, > 0 */
  uint32_t num_kv_heads;     /* standard kind: KV heads of the whole model, divisible by tp_size */
  uint32_t head_dim;         /* standard kind: elements per head */
  uint32_t latent_dim;       /* MLA kind: elements per token and layer */
  uint32_t block_tokens;     /* tokens per block; Default: 16 */
  uint32_t tp_size;          /* tensor-parallel degree = shards per block; Default: 1 */
  uint32_t quant_group_size; /* values per fp32 scale when codec != NONE; Default: 64 */
} kvtier_kv_layout_t;

/* Sets struct_size and the defaults above (num_layers, num_kv_heads, head_dim, latent_dim = 0). */
KVTIER_API void kvtier_kv_layout_init(kvtier_kv_layout_t* layout);

typedef struct kvtier_namespace kvtier_namespace_t;

/* Creates a namespace: tenant and model are required (1..255 bytes), revision may be NULL (absent,
 * which differs from ""). *out receives the handle; free it with kvtier_namespace_free().
 * Errors: INVALID_ARGUMENT naming the bad field ("layout.head_dim: must be > 0"). */
KVTIER_API kvtier_status_code kvtier_namespace_create(const char* tenant, const char* model, const char* revision,
                                                      const kvtier_kv_layout_t* layout, kvtier_namespace_t** out,
                                                      kvtier_error_t* error);
/* Sets the secret per-tenant salt mixed into every fingerprint (never sent to servers), `salt_bytes`
 * bytes at `salt` (at most 255; may contain NULs). Call before the namespace is shared between threads.
 * Errors: INVALID_ARGUMENT (too long, or NULL namespace). */
KVTIER_API kvtier_status_code kvtier_namespace_set_tenant_salt(kvtier_namespace_t* ns, const void* salt,
                                                               size_t salt_bytes, kvtier_error_t* error);
KVTIER_API void kvtier_namespace_free(kvtier_namespace_t* ns);
/* Bytes of one shard of one block: the exact size every get/put buffer must have. */
KVTIER_API uint64_t kvtier_namespace_block_bytes(const kvtier_namespace_t* ns);
/* Tokens per block (layout.block_tokens). */
KVTIER_API uint32_t kvtier_namespace_block_tokens(const kvtier_namespace_t* ns);
/* The namespace's 64-bit id (equal namespaces have equal ids on every machine). */
KVTIER_API uint64_t kvtier_namespace_id(const kvtier_namespace_t* ns);

/* ---------------------------------------------------------------------------------------------- */
/* Fingerprints                                                                                     */

/* A multimodal input whose embedding occupies prompt positions [offset_tokens, offset_tokens +
 * length_tokens); every block overlapping it carries content_hash. */
typedef struct kvtier_multimodal_input {
  const void* content_hash; /* 1..255 bytes identifying the content (e.g. a SHA-256) */
  size_t content_hash_bytes;
  uint32_t offset_tokens;
  uint32_t length_tokens; /* > 0 */
} kvtier_multimodal_input_t;

/* Keys beyond the tokens that change a request's KV. Zero-initialize, then set what applies. */
typedef struct kvtier_extra_keys {
  const char* lora_adapter_id; /* NULL: no LoRA adapter; else 1..255 bytes, hashed into every block */
  uint64_t lora_version;       /* bump when the adapter's weights change */
  const void* cache_salt;      /* NULL: none; else cache_salt_bytes bytes, hashed into block 0 only */
  size_t cache_salt_bytes;
  const kvtier_multimodal_input_t* multimodal; /* num_multimodal entries; may be NULL when 0 */
  size_t num_multimodal;
} kvtier_extra_keys_t;

/* Fingerprints of the full blocks of `tokens` (num_tokens / block_tokens of them; a partial last block
 * gets none): the SHA-256 chain of docs/fingerprints.md. Writes *out_count fingerprints, packed, to
 * `out_fingerprints`, which holds room for `out_capacity` fingerprints (32 bytes each). `extra` may be
 * NULL. Errors: INVALID_ARGUMENT (bad extra keys), OUT_OF_RANGE (out_capacity too small; *out_count
 * is then the number needed and nothing is written). */
KVTIER_API kvtier_status_code kvtier_fingerprint_tokens(const kvtier_namespace_t* ns, const uint32_t* tokens,
                                                        size_t num_tokens, const kvtier_extra_keys_t* extra,
                                                        uint8_t* out_fingerprints, size_t out_capacity,
                                                        size_t* out_count, kvtier_error_t* error);

/* ---------------------------------------------------------------------------------------------- */
/* Client                                                                                           */

/* A per-namespace replication factor (ClientOptions::ReplicationOverride): the first entry whose tenant
 * equals the namespace's tenant and whose model is equal or "" (every model of that tenant) wins. This
 * struct is fixed (it is used in arrays): a later field would come as a new array in
 * kvtier_client_options_t. */
typedef struct kvtier_replication_override {
  const char* tenant;          /* required */
  const char* model;           /* NULL or "": every model of `tenant` */
  uint32_t replication_factor; /* 1..16 */
} kvtier_replication_override_t;

/* Every field of the C++ client's ClientOptions (kvtier/client/client.h, docs/config.md "Client
 * options"), under the same names. Durations are whole milliseconds (`<name>_ms`); a list is a pointer
 * plus a count (`num_<name>`). Strings may be NULL, which means the default (every string defaults to
 * "", except transport: "auto"). Strings and arrays are borrowed for kvtier_client_connect() only.
 *
 * Versioned: kvtier_client_options_init() sets struct_size = sizeof(kvtier_client_options_t) and every
 * default. Fields are only ever appended. The library reads only the fields that lie wholly within the
 * caller's struct_size and gives every later field its default, so a program built against an older
 * kvtier.h keeps working; struct_size must be at least the first release's size (the fields up to
 * virtual_nodes) and at most this library's sizeof(kvtier_client_options_t). */
typedef struct kvtier_client_options {
  uint32_t struct_size;            /* set by kvtier_client_options_init() */
  const char* const* members;      /* "host:port" or "node_id=host:port", num_members of them */
  size_t num_members;              /* at least one member, or members_dns, is required */
  uint32_t rpc_timeout_ms;         /* deadline of every RPC; a slower owner is a miss. Default: 2000 */
  uint32_t connect_timeout_ms;     /* deadline of the node-id query at connect. Default: 5000 */
  uint64_t max_message_bytes;      /* gRPC message limit; must match the servers'. Default: 80 MiB */
  uint64_t stream_chunk_bytes;     /* bytes per streamed write message. Default: 1 MiB */
  uint32_t max_blocks_per_request; /* larger batches are split per owner. Default: 4096 */
  uint32_t put_batch_blocks;       /* blocks per put batch to one owner. Default: 64 */
  uint32_t virtual_nodes;          /* ring points per member. Default: the C++ client's (1024) */
  /* ---- End of the first release. ---- */
  /* Membership from DNS: "NAME:PORT" (each A/AAAA record of NAME is a member at PORT). Default: none. */
  const char* members_dns;
  /* DNS servers asked for members_dns: NULL/"" = the system's; else "IP", "IP:PORT" or "[IPv6]:PORT",
   * comma-separated, any port. */
  const char* dns_server;
  uint32_t dns_refresh_interval_ms;  /* members_dns resolved again this often. Default: 5000 */
  uint32_t dns_timeout_ms;           /* deadline of one resolution. Default: 2000 */
  uint32_t health_check_interval_ms; /* grpc.health.v1 check of every member this often. Default: 1000 */
  uint32_t health_check_timeout_ms;  /* deadline of one check. Default: 1000 */
  uint32_t unhealthy_threshold;      /* failed checks in a row that eject a member. Default: 3 */
  uint32_t healthy_threshold;        /* passed checks in a row that bring it back. Default: 2 */
  uint64_t max_block_bytes;          /* larger blocks are refused up front. Default: 64 MiB */
  const char* transport;             /* data path: "auto" (default), "grpc" or "ucx" */
  const char* ucx_transports;        /* UCX_TLS of the client's UCX context; NULL/"" = UCX's default */
  uint32_t ucx_reconnect_backoff_ms; /* after a UCX endpoint failed, reconnect no sooner. Default: 1000 */
  int32_t ucx_get_lanes;             /* receive threads of a UCX get from a member on this node, 1..64. Default: 2 */
  /* TLS of the gRPC channels: set tls_ca_file (PEM CA of the servers' certificates) for TLS; add
   * tls_cert_file and tls_key_file (both or neither) for mutual TLS. tls_server_name: the name the
   * servers' certificates carry when it is not the host of the member addresses. Default: plaintext. */
  const char* tls_ca_file;
  const char* tls_cert_file;
  const char* tls_key_file;
  const char* tls_server_name;
  /* Bearer token sent on every RPC (servers with `auth`): a worker token of the tenant of every
   * namespace used. Default: none. */
  const char* auth_token;
  /* Replication (docs/architecture.md "Replication"): copies of each block, 1..16. Default: 1. */
  uint32_t replication_factor;
  const kvtier_replication_override_t* replication_overrides; /* num_replication_overrides entries */
  size_t num_replication_overrides;
  uint32_t hot_read_replicas;      /* extra owners of hot blocks, 0..16. Default: 0 (off) */
  uint32_t hot_depth;              /* blocks at a depth below this are hot. Default: 4 */
  uint64_t replica_queue_bytes;    /* bound of the background replica queue. Default: 256 MiB */
  uint64_t hint_queue_bytes;       /* bound of the hinted-handoff queue; 0 = no hints. Default: 256 MiB */
  uint32_t hint_retry_interval_ms; /* hints offered again this often. Default: 1000 */
} kvtier_client_options_t;

/* Sets struct_size and the defaults above (members = NULL, num_members = 0, strings NULL). */
KVTIER_API void kvtier_client_options_init(kvtier_client_options_t* options);

typedef struct kvtier_client kvtier_client_t;

/* Connects to the members (static and from members_dns) and learns their node ids. Members that neither
 * give an id nor answer within connect_timeout_ms stay out of the ring. Errors: INVALID_ARGUMENT (bad
 * options, naming the field: "options.transport: ...", "tls_ca_file: ..."; a struct_size outside the
 * range above), NOT_FOUND (a TLS file that does not exist), UNAVAILABLE (no member could be placed on
 * the ring). */
KVTIER_API kvtier_status_code kvtier_client_connect(const kvtier_client_options_t* options, kvtier_client_t** out,
                                                    kvtier_error_t* error);
/* Closes the channels and frees the client. Calls in flight on other threads must have returned. */
KVTIER_API void kvtier_client_close(kvtier_client_t* client);

/* How many leading blocks of `fingerprints` (num_blocks packed fingerprints, a chain of `ns`) the
 * cluster holds on every TP shard; reusable tokens = *out_prefix_blocks * block_tokens. `out_present`
 * (may be NULL) receives num_blocks bytes, 1 where that block is present. `out_blocks_from_errors`
 * (may be NULL) receives how many blocks were counted as misses because their owner failed.
 * Errors: INVALID_ARGUMENT (bad arguments), or a server's refusal with its code (INVALID_ARGUMENT,
 * PERMISSION_DENIED, UNAUTHENTICATED; see Conventions). */
KVTIER_API kvtier_status_code kvtier_lookup_prefix(kvtier_client_t* client, const kvtier_namespace_t* ns,
                                                   const uint8_t* fingerprints, size_t num_blocks,
                                                   uint32_t* out_prefix_blocks, uint8_t* out_present,
                                                   uint32_t* out_blocks_from_errors, kvtier_error_t* error);

/* Outcome of one block of a get. */
typedef enum kvtier_get_result {
  KVTIER_GET_HIT = 0,              /* the bytes arrived and matched their checksum */
  KVTIER_GET_MISS = 1,             /* the owner does not hold the block */
  KVTIER_GET_MISS_FROM_ERROR = 2,  /* the owner failed, timed out or was unreachable (counted) */
  KVTIER_GET_CHECKSUM_MISMATCH = 3 /* bytes arrived corrupted: discarded, counted */
} kvtier_get_result;

/* Outcome of one block of a put. */
typedef enum kvtier_put_result {
  KVTIER_PUT_STORED = 0,          /* committed by this call */
  KVTIER_PUT_ALREADY_PRESENT = 1, /* the owner had it (its recency was refreshed) */
  KVTIER_PUT_IN_PROGRESS = 2,     /* another writer is storing it now */
  KVTIER_PUT_NO_SPACE = 3,        /* the owner had nothing evictable */
  KVTIER_PUT_ERROR = 4            /* the owner failed, timed out or was unreachable (counted); a refusal
                                     of the request is the call's error code instead */
} kvtier_put_result;

/* Fetches TP shard `shard` of each of num_blocks blocks into buffers[i] (host memory, each exactly
 * `buffer_bytes` = kvtier_namespace_block_bytes(ns) long). out_results[i] (num_blocks entries,
 * required) says which buffers hold valid bytes: only KVTIER_GET_HIT ones do. `out_hits` (may be NULL)
 * receives the number of hits. Errors: INVALID_ARGUMENT (wrong buffer_bytes, shard >= tp_size, NULLs), or
 * a server's refusal with its code (INVALID_ARGUMENT, PERMISSION_DENIED, UNAUTHENTICATED; see Conventions);
 * then no buffer holds valid bytes. */
KVTIER_API kvtier_status_code kvtier_get(kvtier_client_t* client, const kvtier_namespace_t* ns,
                                         const uint8_t* fingerprints, size_t num_blocks, uint32_t shard,
                                         void* const* buffers, uint64_t buffer_bytes, kvtier_get_result* out_results,
                                         uint32_t* out_hits, kvtier_error_t* error);

/* Stores TP shard `shard` of each of num_blocks blocks from blocks[i] (each exactly `block_bytes` =
 * kvtier_namespace_block_bytes(ns) long). `first_block_index` is the index of fingerprints[0] in its
 * prompt's chain (e.g. the hit length when storing the blocks after a hit); eviction policies use it.
 * `out_results` (num_blocks entries) may be NULL. Errors: INVALID_ARGUMENT (bad arguments), or a
 * server's refusal with its code (INVALID_ARGUMENT, e.g. a block above that server's
 * limits.max_block_bytes; PERMISSION_DENIED; UNAUTHENTICATED; see Conventions); blocks other servers
 * stored in the same call stay stored. */
KVTIER_API kvtier_status_code kvtier_put(kvtier_client_t* client, const kvtier_namespace_t* ns,
                                         const uint8_t* fingerprints, size_t num_blocks, uint32_t shard,
                                         const void* const* blocks, uint64_t block_bytes, uint32_t first_block_index,
                                         kvtier_put_result* out_results, kvtier_error_t* error);

/* Monotonic counters of one client (DESIGN.md §5 hit accounting; each block counted once per call):
 * every counter of the C++ client's ClientStats (kvtier/client/client.h documents each), under the same
 * names. Versioned like kvtier_client_options_t: fields are only appended. */
typedef struct kvtier_client_stats {
  uint32_t struct_size; /* the caller sets sizeof(kvtier_client_stats_t) */
  uint64_t lookups;
  uint64_t lookup_blocks;
  uint64_t prefix_hit_blocks;
  uint64_t prefix_hit_tokens;
  uint64_t get_blocks;
  uint64_t retrieve_hit_blocks;
  uint64_t retrieve_hit_tokens;
  uint64_t retrieve_hit_bytes;
  uint64_t put_blocks;
  uint64_t put_stored_blocks;
  uint64_t put_stored_bytes;
  uint64_t put_rejected_blocks;
  uint64_t misses_from_errors;
  uint64_t rpc_errors;
  uint64_t checksum_failures;
  /* ---- End of the first release. ---- */
  uint64_t ucx_get_blocks;        /* blocks that arrived intact over UCX */
  uint64_t ucx_lane_get_blocks;   /* of those, blocks the get lanes received */
  uint64_t ucx_leases;            /* read leases taken over UCX */
  uint64_t ucx_put_blocks;        /* blocks whose bytes the server took over UCX */
  uint64_t ucx_endpoint_failures; /* UCX endpoints dropped after an error or a missed deadline */
  uint64_t ucx_connects;          /* UCX endpoints established */
  uint64_t ring_changes;          /* rings swapped in after connect */
  uint64_t dns_resolutions;       /* members_dns resolutions that answered */
  uint64_t dns_failures;          /* resolutions that failed (the members were kept) */
  uint64_t health_check_failures; /* failed health checks, all members */
  uint64_t members_ejected;       /* ejections from the ring */
  uint64_t replica_puts;          /* replica blocks an owner stored (or had) */
  uint64_t replica_put_failures;  /* replica blocks not stored by an attempt */
  uint64_t hints_queued;          /* replica blocks put in the hinted-handoff queue */
  uint64_t hints_delivered;       /* hinted blocks an owner later stored (or had) */
  uint64_t hints_dropped;         /* hinted blocks dropped over hint_queue_bytes */
  uint64_t replica_read_blocks;   /* hits and present blocks found on an owner other than the first asked */
  uint64_t ucx_allocates;         /* put reservations taken over UCX */
  uint64_t ucx_commits;           /* put commits over UCX */
  uint64_t nccl_get_blocks;       /* blocks that arrived over NCCL into the caller's device buffers */
} kvtier_client_stats_t;

/* Copies the client's counters into the fields of *out that lie wholly within out->struct_size (which the
 * caller has set); bytes beyond this library's struct up to struct_size are zeroed.
 * Errors: INVALID_ARGUMENT (NULL, or struct_size smaller than the first release's struct). */
KVTIER_API kvtier_status_code kvtier_client_stats(const kvtier_client_t* client, kvtier_client_stats_t* out,
                                                  kvtier_error_t* error);

/* Called by kvtier_client_stats_foreach once per counter: its name (as in kvtier_client_stats_t), its
 * value, and a one-line help text. `name` and `help` are NUL-terminated and valid for the call only. */
typedef void (*kvtier_counter_fn)(void* ctx, const char* name, uint64_t value, const char* help);

/* Calls fn(ctx, ...) once for every counter of the client's ClientStats, in the C++ list's order,
 * synchronously on the calling thread; counters added in later releases appear without a new struct.
 * All are monotonic counters. Errors: INVALID_ARGUMENT (client or fn NULL). */
KVTIER_API kvtier_status_code kvtier_client_stats_foreach(const kvtier_client_t* client, kvtier_counter_fn fn,
                                                          void* ctx, kvtier_error_t* error);

/* Called by kvtier_client_server_stats_foreach once per sample of a member's server counters (its admin
 * GetStats: the samples its /metrics serves), and once for each member that gave none:
 *   - a sample: member_status KVTIER_OK, `name` the sample as /metrics writes it (the family, then its
 *     labels in braces, e.g. kvtier_lookup_blocks_total{result="hit"}), its value, is_gauge 1 for a gauge
 *     and 0 for a monotonic counter;
 *   - a member without counters: member_status why (KVTIER_UNAVAILABLE, KVTIER_DEADLINE_EXCEEDED,
 *     KVTIER_PERMISSION_DENIED for a worker token: GetStats is an admin RPC, ...), `name` the error's
 *     message, value 0, is_gauge 0.
 * `address` is the member's host:port and `node_id` its id ("" if never known). Strings are NUL-terminated
 * and valid for the call only. */
typedef void (*kvtier_server_counter_fn)(void* ctx, const char* address, const char* node_id,
                                         kvtier_status_code member_status, const char* name, uint64_t value,
                                         int is_gauge);

/* Asks every member for its server counters at once, each within timeout_ms (> 0), then calls fn(ctx, ...)
 * for each as above, member by member in the order of the client's members, synchronously on the calling
 * thread. Blocks up to timeout_ms. A member that does not answer does not fail the call.
 * Errors: INVALID_ARGUMENT (client or fn NULL, timeout_ms <= 0). */
KVTIER_API kvtier_status_code kvtier_client_server_stats_foreach(const kvtier_client_t* client, int64_t timeout_ms,
                                                                 kvtier_server_counter_fn fn, void* ctx,
                                                                 kvtier_error_t* error);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* KVTIER_KVTIER_H_ */
