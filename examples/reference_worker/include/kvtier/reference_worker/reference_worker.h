// ReferenceWorker: serves prompts with a TinyTransformer and a kvtier cluster, the way an inference
// engine would (DESIGN.md §1, §6):
//   1. fingerprint the prompt's full blocks (kvtier::ChainFingerprints),
//   2. LookupPrefix, Get the leading run of cached blocks into host buffers, dequantize them when the
//      namespace's codec is int8/fp8, and scatter them into the sequence's pages (kernels' ScatterCpu),
//   3. prefill the remaining positions (at least the last one, so there are logits to return),
//   4. gather the newly completed full blocks (GatherCpu), quantize them for a quantized codec, and Put
//      them with first_block_index = the hit length.
// A worker created without a client always recomputes the whole prompt (the reference for tests and the
// "without cache" timings of the demo). Only full blocks are stored; a partial last block is recomputed.
// Thread-safety: none; serve one prompt at a time per worker. Ownership: the client is borrowed and must
// outlive the worker.
#ifndef KVTIER_REFERENCE_WORKER_REFERENCE_WORKER_H_
#define KVTIER_REFERENCE_WORKER_REFERENCE_WORKER_H_

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "kvtier/client/client.h"
#include "kvtier/common/kv_layout.h"
#include "kvtier/common/namespace.h"
#include "kvtier/reference_worker/model_config.h"
#include "kvtier/reference_worker/paged_kv_cache.h"
#include "kvtier/reference_worker/tiny_transformer.h"

namespace kvtier::reference_worker {

struct WorkerOptions {
  ModelConfig model;
  std::string tenant = "reference";  // namespace tenant
  int32_t page_size = 16;            // engine page, tokens; divides block_tokens
  uint32_t block_tokens = 32;        // kvtier block, tokens; a multiple of page_size
  int32_t num_pages = 1024;          // engine cache capacity, pages (a prompt needs ceil(len / page_size))
  Codec codec = Codec::kNone;        // how blocks are stored: as bf16, or int8 / fp8_e4m3 with group scales
  uint32_t quant_group_size = 32;    // values per fp32 scale when codec != kNone; divides head_dim

  // Errors: InvalidArgument naming the field.
  absl::Status Validate() const;
};

// What one Serve() did, for tests and the demo's timings.
struct ServeResult {
  std::vector<float> logits;  // of the last prompt position, vocab_size values
  uint32_t prompt_tokens = 0;
  uint32_t full_blocks = 0;        // prompt_tokens / block_tokens
  uint32_t lookup_hit_blocks = 0;  // leading blocks LookupPrefix reported present
  uint32_t fetched_blocks = 0;     // leading blocks that arrived (Get kHit) and were scattered
  uint32_t computed_from = 0;      // first position prefilled: min(fetched_blocks * B, prompt_tokens - 1)
  uint32_t stored_blocks = 0;      // blocks Put reported kStored or kAlreadyPresent
  uint32_t put_blocks = 0;         // blocks offered to Put
  absl::Duration lookup_time;      // fingerprints + LookupPrefix
  absl::Duration fetch_time;       // Get + dequantize + scatter
  absl::Duration compute_time;     // Prefill
  absl::Duration store_time;       // gather + quantize + Put (after the logits; not part of TTFT)
  // Time to the logits: lookup + fetch + compute.
  absl::Duration ttft() const { return lookup_time + fetch_time + compute_time; }
};

class ReferenceWorker {
 public:
  // Builds the model (weights from options.model.seed) and an engine cache of options.num_pages pages.
  // `client` may be null: every prompt is then recomputed and nothing is stored.
  // Errors: InvalidArgument (bad options).
  static absl::StatusOr<std::unique_ptr<ReferenceWorker>> Create(const WorkerOptions& options, client::Client* client);
  ~ReferenceWorker();

  // Serves one prompt (token ids < vocab_size, at least one token) as described at the top.
  // Cluster trouble (a dead owner, a block evicted between lookup and get, a full server) only shortens
  // the reused prefix or leaves blocks unstored; it is never an error.
  // Errors: InvalidArgument (empty prompt, bad token id), ResourceExhausted (the prompt needs more pages
  // than the engine cache has free), Internal (a kernel rejected its arguments: a bug here).
  absl::StatusOr<ServeResult> Serve(std::span<const uint32_t> prompt);

  // The namespace blocks are stored under (model, revision and layout, codec included).
  const Namespace& ns() const { return ns_; }
  const TinyTransformer& model() const { return model_; }
  const WorkerOptions& options() const { return options_; }

 private:
  ReferenceWorker(const WorkerOptions& options, Namespace ns, TinyTransformer model, client::Client* client);

  WorkerOptions options_;
  Namespace ns_;
  TinyTransformer model_;
  client::Client* client_;  // borrowed; may be null
  PagedKvCache cache_;
};

}  // namespace kvtier::reference_worker

#endif  // KVTIER_REFERENCE_WORKER_REFERENCE_WORKER_H_
