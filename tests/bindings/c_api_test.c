/*
 * A C11 program that uses only kvtier/kvtier.h and libkvtier: it round-trips KV blocks through a running
 * cluster and checks the error paths. Usage: kvtier_c_api_test HOST:PORT [HOST:PORT...], or
 * kvtier_c_api_test --refusing HOST:PORT for a server whose limits.max_block_bytes is below 2 MiB (its
 * refusal must reach the caller with the server's code and message).
 * Exits 0 when every check passed, 1 otherwise (each failure is printed). c_api_driver_test.cc starts
 * the servers and runs it.
 */
#define _POSIX_C_SOURCE 200809L /* nanosleep */
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kvtier/kvtier.h"

static int g_failures = 0;

#define CHECK(cond, ...)                                                       \
  do {                                                                         \
    if (!(cond)) {                                                             \
      ++g_failures;                                                            \
      fprintf(stderr, "%s:%d: CHECK(%s) failed: ", __FILE__, __LINE__, #cond); \
      fprintf(stderr, __VA_ARGS__);                                            \
      fprintf(stderr, "\n");                                                   \
    }                                                                          \
  } while (0)

#define CHECK_OK(call)                                                                                               \
  do {                                                                                                               \
    kvtier_status_code rc_ = (call);                                                                                 \
    CHECK(rc_ == KVTIER_OK, "%s returned %s: %s", #call, kvtier_status_code_name(rc_), kvtier_last_error_message()); \
  } while (0)

/* Deterministic block contents: a function of (block, shard, byte). */
static void fill_block(uint8_t* p, uint64_t n, uint32_t block, uint32_t shard) {
  uint64_t i;
  for (i = 0; i < n; ++i) p[i] = (uint8_t)((block * 131u + shard * 17u + i * 7u + (i >> 8)) & 0xFF);
}

static kvtier_namespace_t* make_namespace(const char* model, uint32_t tp_size) {
  kvtier_kv_layout_t layout;
  kvtier_namespace_t* ns = NULL;
  kvtier_error_t err;
  kvtier_kv_layout_init(&layout);
  layout.num_layers = 2;
  layout.num_kv_heads = 4;
  layout.head_dim = 32;
  layout.block_tokens = 16;
  layout.tp_size = tp_size;
  if (kvtier_namespace_create("c-api-test", model, NULL, &layout, &ns, &err) != KVTIER_OK) {
    fprintf(stderr, "kvtier_namespace_create: %s: %s\n", kvtier_status_code_name(err.code), err.message);
    exit(1);
  }
  return ns;
}

static void check_error_paths(void) {
  kvtier_kv_layout_t layout;
  kvtier_namespace_t* ns = (kvtier_namespace_t*)1;
  kvtier_error_t err;
  kvtier_client_options_t options;
  kvtier_client_t* client = (kvtier_client_t*)1;
  kvtier_status_code rc;

  kvtier_kv_layout_init(&layout);
  layout.num_layers = 2;
  layout.num_kv_heads = 4;
  layout.head_dim = 0; /* invalid */
  rc = kvtier_namespace_create("t", "m", "rev", &layout, &ns, &err);
  CHECK(rc == KVTIER_INVALID_ARGUMENT, "got %s", kvtier_status_code_name(rc));
  CHECK(err.code == KVTIER_INVALID_ARGUMENT, "err.code %d", (int)err.code);
  CHECK(strstr(err.message, "head_dim") != NULL, "message \"%s\" should name head_dim", err.message);
  CHECK(strcmp(kvtier_last_error_message(), err.message) == 0, "last error \"%s\"", kvtier_last_error_message());
  CHECK(kvtier_last_error_code() == KVTIER_INVALID_ARGUMENT, "last code %d", (int)kvtier_last_error_code());
  CHECK(ns == NULL, "a failed create leaves *out NULL");

  /* A struct that was not initialized is rejected, not misread. */
  memset(&layout, 0, sizeof(layout));
  rc = kvtier_namespace_create("t", "m", NULL, &layout, &ns, NULL);
  CHECK(rc == KVTIER_INVALID_ARGUMENT, "uninitialized layout: got %s", kvtier_status_code_name(rc));
  CHECK(strstr(kvtier_last_error_message(), "struct_size") != NULL, "message \"%s\"", kvtier_last_error_message());

  kvtier_client_options_init(&options);
  CHECK(options.rpc_timeout_ms == 2000, "default rpc_timeout_ms %u", options.rpc_timeout_ms);
  rc = kvtier_client_connect(&options, &client, &err); /* no members */
  CHECK(rc == KVTIER_INVALID_ARGUMENT, "no members: got %s", kvtier_status_code_name(rc));
  CHECK(strstr(err.message, "members") != NULL, "message \"%s\"", err.message);
  CHECK(client == NULL, "a failed connect leaves *out NULL");

  CHECK(strcmp(kvtier_status_code_name(KVTIER_UNAVAILABLE), "UNAVAILABLE") == 0, "code names");
  CHECK(strcmp(kvtier_status_code_name((kvtier_status_code)99), "UNKNOWN_CODE") == 0, "unknown code name");
  kvtier_namespace_free(NULL);
  kvtier_client_close(NULL);
}

/* Against one server that takes blocks of at most 1 MiB: 2 MiB blocks are refused by the server, which
 * the client alone cannot know (its own limit is 64 MiB). Every call gives the server's code and message. */
static int check_refusal(const char* member) {
  enum { kBlocks = 2 };
  kvtier_kv_layout_t layout;
  kvtier_namespace_t* ns = NULL;
  kvtier_client_options_t options;
  kvtier_client_t* client = NULL;
  kvtier_error_t err;
  kvtier_status_code rc;
  uint32_t tokens[16 * kBlocks];
  uint8_t fps[kBlocks * KVTIER_FINGERPRINT_BYTES];
  void* buffers[kBlocks];
  const void* blocks[kBlocks];
  kvtier_get_result get_results[kBlocks];
  kvtier_put_result put_results[kBlocks];
  uint32_t prefix = 0;
  size_t count = 0, i;
  uint64_t block_bytes;
  const char* members[1];

  kvtier_kv_layout_init(&layout);
  layout.num_layers = 32; /* [32][2][16][8][128] bf16: 2 MiB */
  layout.num_kv_heads = 8;
  layout.head_dim = 128;
  CHECK_OK(kvtier_namespace_create("c-api-test", "c-api/oversized", NULL, &layout, &ns, NULL));
  block_bytes = kvtier_namespace_block_bytes(ns);
  CHECK(block_bytes == 2u << 20, "block_bytes %llu", (unsigned long long)block_bytes);
  for (i = 0; i < 16 * kBlocks; ++i) tokens[i] = (uint32_t)(i * 7u + 1u);
  CHECK_OK(kvtier_fingerprint_tokens(ns, tokens, 16 * kBlocks, NULL, fps, kBlocks, &count, NULL));
  for (i = 0; i < kBlocks; ++i) {
    buffers[i] = calloc(1, block_bytes);
    blocks[i] = buffers[i];
  }
  kvtier_client_options_init(&options);
  members[0] = member;
  options.members = members;
  options.num_members = 1;
  options.rpc_timeout_ms = 5000;
  rc = kvtier_client_connect(&options, &client, &err);
  if (rc != KVTIER_OK) {
    fprintf(stderr, "kvtier_client_connect: %s: %s\n", kvtier_status_code_name(rc), err.message);
    return 1;
  }

  rc = kvtier_put(client, ns, fps, kBlocks, 0, blocks, block_bytes, 0, put_results, &err);
  printf("oversized put -> %s: %s\n", kvtier_status_code_name(rc), err.message);
  CHECK(rc == KVTIER_INVALID_ARGUMENT, "put: got %s", kvtier_status_code_name(rc));
  CHECK(err.code == KVTIER_INVALID_ARGUMENT, "put: err.code %d", (int)err.code);
  CHECK(strstr(err.message, "this server accepts at most 1048576") != NULL, "put: message \"%s\"", err.message);
  CHECK(strstr(err.message, "refused Allocate") != NULL, "put: message \"%s\" names the RPC", err.message);
  CHECK(kvtier_last_error_code() == KVTIER_INVALID_ARGUMENT, "put: last code %d", (int)kvtier_last_error_code());
  CHECK(strcmp(kvtier_last_error_message(), err.message) == 0, "put: last message \"%s\"", kvtier_last_error_message());

  rc = kvtier_get(client, ns, fps, kBlocks, 0, buffers, block_bytes, get_results, NULL, &err);
  CHECK(rc == KVTIER_INVALID_ARGUMENT, "get: got %s", kvtier_status_code_name(rc));
  CHECK(strstr(err.message, "this server accepts at most 1048576") != NULL, "get: message \"%s\"", err.message);

  rc = kvtier_lookup_prefix(client, ns, fps, kBlocks, &prefix, NULL, NULL, &err);
  CHECK(rc == KVTIER_INVALID_ARGUMENT, "lookup: got %s", kvtier_status_code_name(rc));
  CHECK(strstr(err.message, "this server accepts at most 1048576") != NULL, "lookup: message \"%s\"", err.message);

  for (i = 0; i < kBlocks; ++i) free(buffers[i]);
  kvtier_namespace_free(ns);
  kvtier_client_close(client);
  printf("%s: %d failure(s)\n", g_failures == 0 ? "PASS" : "FAIL", g_failures);
  return g_failures == 0 ? 0 : 1;
}

/* kvtier_client_options_t as the first release declared it: what a program built then passes. */
typedef struct first_release_client_options {
  uint32_t struct_size;
  const char* const* members;
  size_t num_members;
  uint32_t rpc_timeout_ms;
  uint32_t connect_timeout_ms;
  uint64_t max_message_bytes;
  uint64_t stream_chunk_bytes;
  uint32_t max_blocks_per_request;
  uint32_t put_batch_blocks;
  uint32_t virtual_nodes;
} first_release_client_options_t;

/* kvtier_client_stats_t of the first release: 15 counters. */
enum { kFirstReleaseStatsBytes = 8 + 15 * 8 };

/* What kvtier_client_server_stats_foreach reported. */
typedef struct server_tally {
  size_t samples;
  size_t gauges;
  size_t failed_members;
  size_t without_address;
  uint64_t committed_blocks;
  int saw_committed_blocks; /* once per member */
  int saw_host_capacity;    /* once per member */
  size_t members;           /* address changes between consecutive calls: the members reported in turn */
  char last_address[256];
} server_tally;

static void tally_server_counter(void* ctx, const char* address, const char* node_id, kvtier_status_code member_status,
                                 const char* name, uint64_t value, int is_gauge) {
  server_tally* t = (server_tally*)ctx;
  (void)node_id;
  if (address == NULL || address[0] == '\0') {
    ++t->without_address;
  } else if (strcmp(address, t->last_address) != 0) {
    ++t->members;
    snprintf(t->last_address, sizeof(t->last_address), "%s", address);
  }
  if (member_status != KVTIER_OK) {
    ++t->failed_members;
    fprintf(stderr, "server_stats: %s: %s: %s\n", address, kvtier_status_code_name(member_status), name);
    return;
  }
  ++t->samples;
  if (is_gauge) ++t->gauges;
  if (strcmp(name, "kvtier_committed_blocks_total") == 0) {
    t->committed_blocks += value;
    ++t->saw_committed_blocks;
  }
  if (strcmp(name, "kvtier_capacity_bytes{tier=\"host\"}") == 0 && is_gauge && value > 0) ++t->saw_host_capacity;
}

/* The server's counters through the client: every sample of GetStats, the puts made so far counted. */
static void check_server_stats(kvtier_client_t* client, size_t num_members, uint64_t at_least_committed) {
  server_tally t;
  kvtier_error_t err;
  kvtier_status_code rc;
  memset(&t, 0, sizeof(t));
  CHECK_OK(kvtier_client_server_stats_foreach(client, 5000, tally_server_counter, &t, NULL));
  CHECK(t.failed_members == 0, "%zu member(s) gave no counters", t.failed_members);
  CHECK(t.without_address == 0, "%zu sample(s) without the member's address", t.without_address);
  CHECK(t.members == num_members, "counters of %zu member(s), want %zu", t.members, num_members);
  CHECK(t.samples >= 40 * num_members, "only %zu server samples", t.samples);
  CHECK(t.gauges > 0 && t.gauges < t.samples, "%zu gauges of %zu samples", t.gauges, t.samples);
  CHECK(t.saw_committed_blocks == (int)num_members && t.committed_blocks >= at_least_committed,
        "kvtier_committed_blocks_total %llu (seen %d times), want >= %llu", (unsigned long long)t.committed_blocks,
        t.saw_committed_blocks, (unsigned long long)at_least_committed);
  CHECK(t.saw_host_capacity == (int)num_members, "kvtier_capacity_bytes{tier=\"host\"} seen %d times",
        t.saw_host_capacity);
  rc = kvtier_client_server_stats_foreach(client, 0, tally_server_counter, &t, &err);
  CHECK(rc == KVTIER_INVALID_ARGUMENT && strstr(err.message, "timeout_ms") != NULL, "timeout 0: %s: %s",
        kvtier_status_code_name(rc), err.message);
  rc = kvtier_client_server_stats_foreach(client, 5000, NULL, &t, &err);
  CHECK(rc == KVTIER_INVALID_ARGUMENT, "server stats without fn: %s", kvtier_status_code_name(rc));
}

/* What kvtier_client_stats_foreach reported: how many counters, and the value of put_blocks. */
typedef struct counter_tally {
  size_t counters;
  size_t without_help;
  uint64_t put_blocks;
  int saw_put_blocks;
} counter_tally;

static void tally_counter(void* ctx, const char* name, uint64_t value, const char* help) {
  counter_tally* t = (counter_tally*)ctx;
  ++t->counters;
  if (help == NULL || help[0] == '\0') ++t->without_help;
  if (strcmp(name, "put_blocks") == 0) {
    t->put_blocks = value;
    ++t->saw_put_blocks;
  }
}

static void sleep_ms(long ms) {
  struct timespec t;
  t.tv_sec = ms / 1000;
  t.tv_nsec = (ms % 1000) * 1000000L;
  nanosleep(&t, NULL);
}

/* Puts and reads `n` blocks of `ns`; returns the number of get hits whose bytes were right. */
static uint32_t round_trip(kvtier_client_t* client, kvtier_namespace_t* ns, const uint8_t* fps, size_t n,
                           uint32_t seed) {
  enum { kMax = 8 };
  void* buffers[kMax];
  const void* blocks[kMax];
  uint8_t* expected[kMax];
  kvtier_get_result results[kMax];
  uint64_t block_bytes = kvtier_namespace_block_bytes(ns);
  uint32_t good = 0;
  size_t i;
  if (n > kMax) n = kMax;
  for (i = 0; i < n; ++i) {
    expected[i] = (uint8_t*)malloc(block_bytes);
    buffers[i] = malloc(block_bytes);
    fill_block(expected[i], block_bytes, (uint32_t)i + seed, 0);
    memset(buffers[i], 0xEE, block_bytes);
    blocks[i] = expected[i];
  }
  CHECK_OK(kvtier_put(client, ns, fps, n, 0, blocks, block_bytes, 0, NULL, NULL));
  CHECK_OK(kvtier_get(client, ns, fps, n, 0, buffers, block_bytes, results, NULL, NULL));
  for (i = 0; i < n; ++i) {
    if (results[i] == KVTIER_GET_HIT && memcmp(buffers[i], expected[i], block_bytes) == 0) ++good;
    free(expected[i]);
    free(buffers[i]);
  }
  return good;
}

/* The versioned options struct: a program built against the first release (a smaller struct, followed
 * here by bytes that would crash or misconfigure a library that read them), every field appended since
 * (transport, replication and its overrides), and struct sizes outside the range. */
static void check_versioned_options(const char* const* members, size_t num_members, kvtier_namespace_t* ns) {
  union {
    kvtier_client_options_t current;
    unsigned char bytes[sizeof(kvtier_client_options_t) + 64];
  } old_caller;
  union {
    kvtier_client_stats_t current;
    unsigned char bytes[sizeof(kvtier_client_stats_t)];
  } old_stats;
  first_release_client_options_t old;
  kvtier_client_options_t options;
  kvtier_replication_override_t overrides[2];
  kvtier_client_stats_t stats;
  kvtier_client_t* client = NULL;
  kvtier_error_t err;
  kvtier_status_code rc;
  uint32_t tokens[16 * 8];
  uint8_t fps[8 * KVTIER_FINGERPRINT_BYTES];
  size_t count = 0, i;
  int waited;

  for (i = 0; i < 16 * 8; ++i) tokens[i] = (uint32_t)(i * 40503u + 11u) % 50000u;
  CHECK_OK(kvtier_fingerprint_tokens(ns, tokens, 16 * 8, NULL, fps, 8, &count, NULL));

  /* First-release caller. */
  memset(&old, 0, sizeof(old));
  old.struct_size = sizeof(old);
  old.members = members;
  old.num_members = num_members;
  old.rpc_timeout_ms = 5000;
  old.connect_timeout_ms = 5000;
  old.max_message_bytes = 80u << 20;
  old.stream_chunk_bytes = 1u << 20;
  old.max_blocks_per_request = 4096;
  old.put_batch_blocks = 64;
  old.virtual_nodes = 128;
  memset(old_caller.bytes, 0xAB, sizeof(old_caller.bytes));
  memcpy(old_caller.bytes, &old, sizeof(old));
  rc = kvtier_client_connect(&old_caller.current, &client, &err);
  CHECK(rc == KVTIER_OK, "first-release struct (%u bytes): %s: %s", (unsigned)sizeof(old), kvtier_status_code_name(rc),
        err.message);
  if (rc == KVTIER_OK) {
    CHECK(round_trip(client, ns, fps, 4, 100) == 4, "first-release caller: round trip");
    /* A first-release stats struct: the counters appended since are not written. */
    memset(old_stats.bytes, 0xCD, sizeof(old_stats.bytes));
    old_stats.current.struct_size = kFirstReleaseStatsBytes;
    CHECK_OK(kvtier_client_stats(client, &old_stats.current, NULL));
    CHECK(old_stats.current.put_blocks == 4, "old stats put_blocks %llu",
          (unsigned long long)old_stats.current.put_blocks);
    for (i = kFirstReleaseStatsBytes; i < sizeof(old_stats.bytes); ++i) {
      CHECK(old_stats.bytes[i] == 0xCD, "stats byte %zu beyond the caller's struct_size was written", i);
    }
    /* Every counter by name: as many as the struct has (its uint64_t fields), each once, with help. */
    {
      counter_tally tally;
      memset(&tally, 0, sizeof(tally));
      CHECK_OK(kvtier_client_stats_foreach(client, tally_counter, &tally, NULL));
      CHECK(tally.counters == (sizeof(kvtier_client_stats_t) - 8) / 8, "foreach listed %zu counters, want %zu",
            tally.counters, (size_t)((sizeof(kvtier_client_stats_t) - 8) / 8));
      CHECK(tally.without_help == 0, "%zu counters without help", tally.without_help);
      CHECK(tally.saw_put_blocks == 1 && tally.put_blocks == 4, "foreach put_blocks %llu (seen %d times)",
            (unsigned long long)tally.put_blocks, tally.saw_put_blocks);
      rc = kvtier_client_stats_foreach(client, NULL, &tally, &err);
      CHECK(rc == KVTIER_INVALID_ARGUMENT, "foreach without fn: %s", kvtier_status_code_name(rc));
    }
    check_server_stats(client, num_members, 4);
    kvtier_client_close(client);
    client = NULL;
  }

  /* Too small, too large. */
  old.struct_size = (uint32_t)offsetof(first_release_client_options_t, virtual_nodes); /* cuts virtual_nodes */
  rc = kvtier_client_connect((const kvtier_client_options_t*)&old, &client, &err);
  CHECK(rc == KVTIER_INVALID_ARGUMENT && strstr(err.message, "struct_size") != NULL, "short struct: %s: %s",
        kvtier_status_code_name(rc), err.message);
  kvtier_client_options_init(&old_caller.current);
  old_caller.current.members = members;
  old_caller.current.num_members = num_members;
  old_caller.current.struct_size = sizeof(old_caller.bytes);
  rc = kvtier_client_connect(&old_caller.current, &client, &err);
  CHECK(rc == KVTIER_INVALID_ARGUMENT && strstr(err.message, "struct_size") != NULL, "newer struct: %s: %s",
        kvtier_status_code_name(rc), err.message);

  /* Appended fields are taken: a bad transport is refused by name, and "ucx" (these servers have no UCX)
   * turns every block into a miss from error. */
  kvtier_client_options_init(&options);
  CHECK(options.struct_size == sizeof(options), "init struct_size");
  CHECK(options.transport == NULL && options.replication_factor == 1 && options.dns_refresh_interval_ms == 5000 &&
            options.hint_queue_bytes == (256u << 20) && options.ucx_get_lanes == 2,
        "defaults of the appended fields");
  options.members = members;
  options.num_members = num_members;
  options.transport = "carrier-pigeon";
  rc = kvtier_client_connect(&options, &client, &err);
  CHECK(rc == KVTIER_INVALID_ARGUMENT && strstr(err.message, "transport") != NULL, "bad transport: %s: %s",
        kvtier_status_code_name(rc), err.message);
  options.transport = "ucx";
  options.rpc_timeout_ms = 1000;
  CHECK_OK(kvtier_client_connect(&options, &client, &err));
  if (client != NULL) {
    CHECK(round_trip(client, ns, fps + 4 * 32, 2, 200) == 0, "transport ucx without UCX servers: no hit");
    memset(&stats, 0, sizeof(stats));
    stats.struct_size = sizeof(stats);
    CHECK_OK(kvtier_client_stats(client, &stats, NULL));
    CHECK(stats.misses_from_errors == 2, "misses from errors %llu", (unsigned long long)stats.misses_from_errors);
    kvtier_client_close(client);
    client = NULL;
  }

  /* Replication: the override for this namespace (R = 3) wins over replication_factor (2), so each block
   * gets two replica copies. */
  memset(overrides, 0, sizeof(overrides));
  overrides[0].tenant = "another-tenant";
  overrides[0].replication_factor = 2;
  overrides[1].tenant = "c-api-test";
  overrides[1].model = "c-api/model";
  overrides[1].replication_factor = 3;
  kvtier_client_options_init(&options);
  options.members = members;
  options.num_members = num_members;
  options.transport = "grpc";
  options.rpc_timeout_ms = 5000;
  options.replication_factor = 2;
  options.replication_overrides = overrides;
  options.num_replication_overrides = 2;
  overrides[1].tenant = NULL;
  rc = kvtier_client_connect(&options, &client, &err);
  CHECK(rc == KVTIER_INVALID_ARGUMENT && strstr(err.message, "replication_overrides[1].tenant") != NULL,
        "NULL override tenant: %s: %s", kvtier_status_code_name(rc), err.message);
  overrides[1].tenant = "c-api-test";
  CHECK_OK(kvtier_client_connect(&options, &client, &err));
  if (client != NULL) {
    CHECK(round_trip(client, ns, fps + 6 * 32, 2, 300) == 2, "replicated round trip");
    memset(&stats, 0, sizeof(stats));
    stats.struct_size = sizeof(stats);
    for (waited = 0; waited < 100; ++waited) { /* replicas are put in the background */
      CHECK_OK(kvtier_client_stats(client, &stats, NULL));
      if (stats.replica_puts >= 4) break;
      sleep_ms(50);
    }
    CHECK(stats.replica_puts == 4, "replica_puts %llu, want 2 blocks x 2 replicas",
          (unsigned long long)stats.replica_puts);
    kvtier_client_close(client);
  }
}

int main(int argc, char** argv) {
  enum { kTokens = 16 * 24 + 5, kBlocks = 24, kStored = 16 };
  uint32_t tokens[kTokens];
  uint8_t fps[kBlocks * KVTIER_FINGERPRINT_BYTES];
  uint8_t lora_fps[kBlocks * KVTIER_FINGERPRINT_BYTES];
  uint8_t present[kBlocks];
  kvtier_get_result get_results[kBlocks];
  kvtier_put_result put_results[kBlocks];
  void* buffers[kBlocks];
  const void* blocks[kBlocks];
  uint8_t* expected[kBlocks];
  kvtier_client_options_t options;
  kvtier_client_t* client = NULL;
  kvtier_namespace_t* ns;
  kvtier_namespace_t* ns_tp2;
  kvtier_extra_keys_t extra;
  kvtier_client_stats_t stats;
  kvtier_error_t err;
  kvtier_status_code rc;
  size_t count = 0, i;
  uint32_t prefix = 99, hits = 0, from_errors = 99;
  uint64_t block_bytes;

  if (argc < 2) {
    fprintf(stderr, "usage: %s HOST:PORT [HOST:PORT...] | --refusing HOST:PORT\n", argv[0]);
    return 2;
  }
  if (strcmp(argv[1], "--refusing") == 0) {
    if (argc != 3) return 2;
    return check_refusal(argv[2]);
  }
  printf("kvtier %s, %d member(s)\n", kvtier_version(), argc - 1);
  check_error_paths();

  ns = make_namespace("c-api/model", 1);
  block_bytes = kvtier_namespace_block_bytes(ns);
  CHECK(block_bytes == 2u * 2u * 16u * 4u * 32u * 2u, "block_bytes %llu", (unsigned long long)block_bytes);
  CHECK(kvtier_namespace_block_tokens(ns) == 16, "block_tokens");
  CHECK(kvtier_namespace_id(ns) != 0, "namespace id");

  for (i = 0; i < kTokens; ++i) tokens[i] = (uint32_t)((i * 2654435761u) % 50000u);
  /* Too small an output buffer: OUT_OF_RANGE, and the count needed. */
  rc = kvtier_fingerprint_tokens(ns, tokens, kTokens, NULL, fps, 1, &count, &err);
  CHECK(rc == KVTIER_OUT_OF_RANGE, "capacity 1: got %s", kvtier_status_code_name(rc));
  CHECK(count == kBlocks, "needed %zu", count);
  CHECK_OK(kvtier_fingerprint_tokens(ns, tokens, kTokens, NULL, fps, kBlocks, &count, NULL));
  CHECK(count == kBlocks, "a partial last block gets no fingerprint: %zu", count);
  /* Extra keys change every fingerprint. */
  memset(&extra, 0, sizeof(extra));
  extra.lora_adapter_id = "adapter-a";
  extra.lora_version = 3;
  CHECK_OK(kvtier_fingerprint_tokens(ns, tokens, kTokens, &extra, lora_fps, kBlocks, &count, NULL));
  for (i = 0; i < kBlocks; ++i) {
    CHECK(memcmp(fps + i * 32, lora_fps + i * 32, 32) != 0, "lora fingerprint %zu equals the base one", i);
  }

  kvtier_client_options_init(&options);
  options.members = (const char* const*)(argv + 1);
  options.num_members = (size_t)(argc - 1);
  options.rpc_timeout_ms = 5000;
  rc = kvtier_client_connect(&options, &client, &err);
  if (rc != KVTIER_OK) {
    fprintf(stderr, "kvtier_client_connect: %s: %s\n", kvtier_status_code_name(rc), err.message);
    return 1;
  }

  CHECK_OK(kvtier_lookup_prefix(client, ns, fps, kBlocks, &prefix, present, &from_errors, NULL));
  CHECK(prefix == 0, "empty cluster: prefix %u", prefix);
  CHECK(from_errors == 0, "blocks from errors %u", from_errors);

  for (i = 0; i < kBlocks; ++i) {
    expected[i] = (uint8_t*)malloc(block_bytes);
    buffers[i] = malloc(block_bytes);
    fill_block(expected[i], block_bytes, (uint32_t)i, 0);
    memset(buffers[i], 0xEE, block_bytes);
    blocks[i] = expected[i];
  }
  CHECK_OK(kvtier_put(client, ns, fps, kStored, 0, blocks, block_bytes, 0, put_results, NULL));
  for (i = 0; i < kStored; ++i) CHECK(put_results[i] == KVTIER_PUT_STORED, "put %zu: %d", i, (int)put_results[i]);

  CHECK_OK(kvtier_lookup_prefix(client, ns, fps, kBlocks, &prefix, present, NULL, NULL));
  CHECK(prefix == kStored, "prefix %u, want %d", prefix, kStored);
  for (i = 0; i < kBlocks; ++i) CHECK(present[i] == (i < kStored), "present[%zu] = %u", i, present[i]);

  CHECK_OK(kvtier_get(client, ns, fps, kBlocks, 0, buffers, block_bytes, get_results, &hits, NULL));
  CHECK(hits == kStored, "hits %u", hits);
  for (i = 0; i < kBlocks; ++i) {
    if (i < kStored) {
      CHECK(get_results[i] == KVTIER_GET_HIT, "get %zu: %d", i, (int)get_results[i]);
      CHECK(memcmp(buffers[i], expected[i], block_bytes) == 0, "block %zu bytes differ", i);
    } else {
      CHECK(get_results[i] == KVTIER_GET_MISS, "get %zu: %d, want MISS", i, (int)get_results[i]);
    }
  }

  /* Storing again: already present. Storing the rest continues the chain at index kStored. */
  CHECK_OK(kvtier_put(client, ns, fps, 2, 0, blocks, block_bytes, 0, put_results, NULL));
  CHECK(put_results[0] == KVTIER_PUT_ALREADY_PRESENT, "re-put: %d", (int)put_results[0]);
  CHECK_OK(kvtier_put(client, ns, fps + kStored * 32, kBlocks - kStored, 0, blocks + kStored, block_bytes, kStored,
                      NULL, NULL));
  CHECK_OK(kvtier_lookup_prefix(client, ns, fps, kBlocks, &prefix, NULL, NULL, NULL));
  CHECK(prefix == kBlocks, "prefix after the rest: %u", prefix);

  /* Wrong buffer size and shard out of range: INVALID_ARGUMENT with the sizes in the message. */
  rc = kvtier_get(client, ns, fps, 1, 0, buffers, block_bytes - 1, get_results, NULL, &err);
  CHECK(rc == KVTIER_INVALID_ARGUMENT, "short buffer: %s", kvtier_status_code_name(rc));
  printf("short buffer -> %s: %s\n", kvtier_status_code_name(rc), err.message);
  rc = kvtier_get(client, ns, fps, 1, 1, buffers, block_bytes, get_results, NULL, &err);
  CHECK(rc == KVTIER_INVALID_ARGUMENT, "shard 1 of tp 1: %s", kvtier_status_code_name(rc));

  /* Tensor parallel: a block counts only when every shard is stored. */
  ns_tp2 = make_namespace("c-api/model-tp2", 2);
  CHECK(kvtier_namespace_block_bytes(ns_tp2) == block_bytes / 2, "tp2 shard bytes");
  CHECK_OK(kvtier_fingerprint_tokens(ns_tp2, tokens, 16 * 4, NULL, fps, kBlocks, &count, NULL));
  CHECK(count == 4, "tp2 count %zu", count);
  CHECK_OK(kvtier_put(client, ns_tp2, fps, 4, 0, blocks, block_bytes / 2, 0, NULL, NULL));
  CHECK_OK(kvtier_lookup_prefix(client, ns_tp2, fps, 4, &prefix, NULL, NULL, NULL));
  CHECK(prefix == 0, "only shard 0 stored: prefix %u", prefix);
  CHECK_OK(kvtier_put(client, ns_tp2, fps, 4, 1, blocks + 4, block_bytes / 2, 0, NULL, NULL));
  CHECK_OK(kvtier_lookup_prefix(client, ns_tp2, fps, 4, &prefix, NULL, NULL, NULL));
  CHECK(prefix == 4, "both shards stored: prefix %u", prefix);
  CHECK_OK(kvtier_get(client, ns_tp2, fps, 4, 1, buffers, block_bytes / 2, get_results, &hits, NULL));
  CHECK(hits == 4 && memcmp(buffers[0], expected[4], block_bytes / 2) == 0, "tp2 shard 1 bytes");

  memset(&stats, 0, sizeof(stats));
  stats.struct_size = sizeof(stats);
  CHECK_OK(kvtier_client_stats(client, &stats, NULL));
  CHECK(stats.lookups == 5, "lookups %llu", (unsigned long long)stats.lookups);
  CHECK(stats.retrieve_hit_blocks == kStored + 4, "retrieve hits %llu", (unsigned long long)stats.retrieve_hit_blocks);
  CHECK(stats.put_stored_blocks == kBlocks + 8, "stored %llu", (unsigned long long)stats.put_stored_blocks);
  CHECK(stats.misses_from_errors == 0, "misses from errors %llu", (unsigned long long)stats.misses_from_errors);
  printf("stats: lookups=%llu prefix_hit_blocks=%llu retrieve_hit_bytes=%llu put_stored_bytes=%llu\n",
         (unsigned long long)stats.lookups, (unsigned long long)stats.prefix_hit_blocks,
         (unsigned long long)stats.retrieve_hit_bytes, (unsigned long long)stats.put_stored_bytes);

  for (i = 0; i < kBlocks; ++i) {
    free(expected[i]);
    free(buffers[i]);
  }
  kvtier_client_close(client);
  client = NULL;
  check_versioned_options((const char* const*)(argv + 1), (size_t)(argc - 1), ns);
  kvtier_namespace_free(ns_tp2);
  kvtier_namespace_free(ns);
  printf("%s: %d failure(s)\n", g_failures == 0 ? "PASS" : "FAIL", g_failures);
  return g_failures == 0 ? 0 : 1;
}
