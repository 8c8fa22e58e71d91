/* c_client: a C program that uses an installed kvtier C API (find_package(kvtier CONFIG) giving
 * kvtier::c, or pkg-config --cflags --libs kvtier). It stores the KV blocks of one prompt in a kvtier
 * cluster, finds them again by prefix, reads them back and checks every byte. Exit status 0 when all
 * of that worked, 1 otherwise.
 *
 * Usage: c_client HOST:PORT [HOST:PORT ...]
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvtier/kvtier.h"

#define BLOCKS 4
#define BLOCK_TOKENS 16

static int fail(const char* what, const kvtier_error_t* error) {
  fprintf(stderr, "c_client: %s: %s: %s\n", what, kvtier_status_code_name(error->code), error->message);
  return 1;
}

int main(int argc, char** argv) {
  kvtier_error_t error;
  kvtier_kv_layout_t layout;
  kvtier_namespace_t* ns = NULL;
  kvtier_client_options_t options;
  kvtier_client_t* client = NULL;
  uint32_t tokens[BLOCKS * BLOCK_TOKENS + 5];
  uint8_t fps[BLOCKS * KVTIER_FINGERPRINT_BYTES];
  size_t num_fps = 0, i, b;
  void* blocks[BLOCKS];
  void* out[BLOCKS];
  kvtier_get_result results[BLOCKS];
  uint32_t prefix_blocks = 0, hits = 0;
  uint64_t block_bytes;
  int rc = 1;

  if (argc < 2) {
    fprintf(stderr, "usage: %s HOST:PORT [HOST:PORT ...]\n", argv[0]);
    return 2;
  }
  printf("c_client: kvtier %s\n", kvtier_version());
  kvtier_kv_layout_init(&layout); /* a small model: 2 layers, 2 KV heads of 16 dims, bf16 */
  layout.num_layers = 2;
  layout.num_kv_heads = 2;
  layout.head_dim = 16;
  layout.block_tokens = BLOCK_TOKENS;
  if (kvtier_namespace_create("examples", "c-client/tiny", NULL, &layout, &ns, &error) != KVTIER_OK) {
    return fail("namespace", &error);
  }
  for (i = 0; i < sizeof(tokens) / sizeof(tokens[0]); ++i) tokens[i] = (uint32_t)(2000 + i);
  if (kvtier_fingerprint_tokens(ns, tokens, sizeof(tokens) / sizeof(tokens[0]), NULL, fps, BLOCKS, &num_fps, &error) !=
      KVTIER_OK) {
    kvtier_namespace_free(ns);
    return fail("fingerprints", &error);
  }

  kvtier_client_options_init(&options);
  options.members = (const char* const*)(argv + 1);
  options.num_members = (size_t)(argc - 1);
  options.rpc_timeout_ms = 5000;
  if (kvtier_client_connect(&options, &client, &error) != KVTIER_OK) {
    kvtier_namespace_free(ns);
    return fail("connect", &error);
  }

  block_bytes = kvtier_namespace_block_bytes(ns);
  for (b = 0; b < BLOCKS; ++b) {
    blocks[b] = malloc(block_bytes);
    out[b] = malloc(block_bytes);
    for (i = 0; i < block_bytes; ++i) ((uint8_t*)blocks[b])[i] = (uint8_t)((b * 131 + i * 7) & 0xff);
  }
  if (kvtier_put(client, ns, fps, num_fps, 0, (const void* const*)blocks, block_bytes, 0, NULL, &error) != KVTIER_OK) {
    rc = fail("put", &error);
  } else if (kvtier_lookup_prefix(client, ns, fps, num_fps, &prefix_blocks, NULL, NULL, &error) != KVTIER_OK) {
    rc = fail("lookup", &error);
  } else if (prefix_blocks != num_fps) {
    fprintf(stderr, "c_client: lookup found %u of %zu blocks\n", prefix_blocks, num_fps);
  } else if (kvtier_get(client, ns, fps, num_fps, 0, out, block_bytes, results, &hits, &error) != KVTIER_OK) {
    rc = fail("get", &error);
  } else if (hits != num_fps) {
    fprintf(stderr, "c_client: get hit %u of %zu blocks\n", hits, num_fps);
  } else {
    rc = 0;
    for (b = 0; b < BLOCKS; ++b) {
      if (memcmp(blocks[b], out[b], block_bytes) != 0) {
        fprintf(stderr, "c_client: block %zu came back different\n", b);
        rc = 1;
      }
    }
    if (rc == 0)
      printf("c_client: stored, found and read back %zu blocks of %llu bytes\n", num_fps,
             (unsigned long long)block_bytes);
  }
  for (b = 0; b < BLOCKS; ++b) {
    free(blocks[b]);
    free(out[b]);
  }
  kvtier_client_close(client);
  kvtier_namespace_free(ns);
  return rc;
}
