#include "kvtier/reference_worker/reference_worker.h"

#include <algorithm>
#include <cstddef>
#include <utility>

#include "absl/strings/str_cat.h"
#include "kvtier/common/fingerprint.h"
#include "kvtier/common/status_macros.h"
#include "kvtier/kernels/gather_scatter.h"
#include "kvtier/kernels/quantize.h"

namespace kvtier::reference_worker {
namespace {

// The kernels' status at this component's edge (HOUSE_STYLE §3). The worker builds every spec and
// table itself, so a rejection is a bug here: Internal.
absl::Status FromKernel(const kernels::KernelStatus& s, const char* what) {
  if (s.ok()) return absl::OkStatus();
  return absl::InternalError(absl::StrCat(what, ": ", s.message, " (kernel status ", s.code, ")"));
}

kernels::PagedCacheSpec CacheSpec(const WorkerOptions& o) {
  return {.block = {.kind = kernels::BlockKind::kStandard,
                    .num_layers = o.model.num_layers,
                    .block_tokens = static_cast<int32_t>(o.block_tokens),
                    .num_kv_heads = o.model.num_kv_heads,
                    .head_dim = o.model.head_dim},
          .layout = kernels::EngineLayout::kKvFirst,
          .num_pages = o.num_pages,
          .page_size = o.page_size,
          .element_bytes = 2};
}

kernels::QuantSpec QuantSpecOf(const WorkerOptions& o) {
  return {.block = CacheSpec(o).block,
          .float_type = kernels::FloatType::kBf16,
          .codec = o.codec == Codec::kInt8 ? kernels::QuantCodec::kInt8 : kernels::QuantCodec::kFp8E4m3,
          .quant_group_size = static_cast<int32_t>(o.quant_group_size)};
}

// `n` host buffers of `bytes` each, and the views the kernels and the client take.
struct Buffers {
  Buffers(size_t n, uint64_t bytes) : data(n, std::vector<std::byte>(bytes)) {
    for (auto& d : data) {
      ptrs.push_back(d.data());
      const_ptrs.push_back(d.data());
      spans.emplace_back(d);
      const_spans.emplace_back(d);
    }
  }
  std::vector<std::vector<std::byte>> data;
  std::vector<void*> ptrs;
  std::vector<const void*> const_ptrs;
  std::vector<std::span<std::byte>> spans;
  std::vector<std::span<const std::byte>> const_spans;
};

}  // namespace

absl::Status WorkerOptions::Validate() const {
  KVTIER_RETURN_IF_ERROR(model.Validate());
  if (page_size <= 0 || block_tokens == 0 || block_tokens % static_cast<uint32_t>(page_size) != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("block_tokens ", block_tokens, " is not a positive multiple of page_size ", page_size));
  }
  if (num_pages <= 0) return absl::InvalidArgumentError(absl::StrCat("num_pages is ", num_pages));
  if (codec != Codec::kNone && (quant_group_size == 0 || model.head_dim % quant_group_size != 0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("quant_group_size ", quant_group_size, " does not divide head_dim ", model.head_dim));
  }
  KVTIER_RETURN_IF_ERROR(FromKernel(CacheSpec(*this).Validate(), "paged cache spec"));
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<ReferenceWorker>> ReferenceWorker::Create(const WorkerOptions& options,
                                                                         client::Client* client) {
  KVTIER_RETURN_IF_ERROR(options.Validate());
  KVTIER_ASSIGN_OR_RETURN(Namespace ns, ModelNamespace(options.model, options.tenant, options.block_tokens,
                                                       options.codec, options.quant_group_size));
  // The kernels' block bytes and the namespace's must agree, or Get/Put would reject every block.
  const uint64_t kernel_bytes = options.codec == Codec::kNone
                                    ? static_cast<uint64_t>(CacheSpec(options).BlockBytes())
                                    : static_cast<uint64_t>(QuantSpecOf(options).QuantizedBlockBytes());
  if (kernel_bytes != ns.layout.ShardBytes()) {
    return absl::InternalError(absl::StrCat("kernels pack ", kernel_bytes, " bytes per block, layout ",
                                            ns.layout.DebugString(), " wants ", ns.layout.ShardBytes()));
  }
  if (options.codec != Codec::kNone) {
    KVTIER_RETURN_IF_ERROR(FromKernel(QuantSpecOf(options).Validate(), "quant spec"));
  }
  KVTIER_ASSIGN_OR_RETURN(TinyTransformer model, TinyTransformer::Create(options.model));
  return std::unique_ptr<ReferenceWorker>(new ReferenceWorker(options, std::move(ns), std::move(model), client));
}

ReferenceWorker::ReferenceWorker(const WorkerOptions& options, Namespace ns, TinyTransformer model,
                                 client::Client* client)
    : options_(options),
      ns_(std::move(ns)),
      model_(std::move(model)),
      client_(client),
      cache_(options.model.num_layers, options.num_pages, options.page_size, options.model.num_kv_heads,
             options.model.head_dim) {}

ReferenceWorker::~ReferenceWorker() = default;

absl::StatusOr<ServeResult> ReferenceWorker::Serve(std::span<const uint32_t> prompt) {
  if (prompt.empty()) return absl::InvalidArgumentError("empty prompt");
  for (size_t i = 0; i < prompt.size(); ++i) {
    if (prompt[i] >= static_cast<uint32_t>(options_.model.vocab_size)) {
      return absl::InvalidArgumentError(
          absl::StrCat("prompt token ", i, " is ", prompt[i], ", want < vocab_size ", options_.model.vocab_size));
    }
  }
  const int32_t n = static_cast<int32_t>(prompt.size());
  const uint32_t block_tokens = options_.block_tokens;
  const int32_t pages_per_block = static_cast<int32_t>(block_tokens) / options_.page_size;
  const kernels::PagedCacheSpec spec = CacheSpec(options_);
  const uint64_t shard_bytes = ns_.layout.ShardBytes();
  const bool quantized = options_.codec != Codec::kNone;

  ServeResult result;
  result.prompt_tokens = static_cast<uint32_t>(n);
  result.full_blocks = static_cast<uint32_t>(n) / block_tokens;

  KVTIER_ASSIGN_OR_RETURN(std::vector<int32_t> pages, cache_.Allocate(n));
  struct PageReturner {  // pages go back to the free list on every path out
    PagedKvCache& cache;
    const std::vector<int32_t>& pages;
    ~PageReturner() { cache.Free(pages); }
  } returner{cache_, pages};

  // 1-2. Fingerprint, look up, fetch the leading run of hits and scatter it into this prompt's pages.
  std::vector<Fingerprint> fps;
  absl::Time t0 = absl::Now();
  if (client_ != nullptr && result.full_blocks > 0) {
    KVTIER_ASSIGN_OR_RETURN(fps, ChainFingerprints(ns_, prompt));
    KVTIER_ASSIGN_OR_RETURN(client::LookupResult lookup, client_->LookupPrefix(ns_, fps));
    result.lookup_hit_blocks = lookup.prefix_blocks;
  }
  absl::Time t1 = absl::Now();
  result.lookup_time = t1 - t0;
  if (result.lookup_hit_blocks > 0) {
    const uint32_t k = result.lookup_hit_blocks;
    Buffers fetched(k, shard_bytes);
    KVTIER_ASSIGN_OR_RETURN(std::vector<client::GetResult> got,
                            client_->Get(ns_, std::span(fps).first(k), 0, fetched.spans));
    uint32_t run = 0;  // a block evicted since the lookup ends the reusable prefix there
    while (run < k && got[run] == client::GetResult::kHit) ++run;
    if (run > 0) {
      const void* const* bf16_blocks = fetched.const_ptrs.data();
      std::unique_ptr<Buffers> dequantized;
      if (quantized) {
        dequantized = std::make_unique<Buffers>(run, static_cast<uint64_t>(spec.BlockBytes()));
        KVTIER_RETURN_IF_ERROR(FromKernel(kernels::DequantizeCpu(QuantSpecOf(options_), fetched.const_ptrs.data(),
                                                                 static_cast<int32_t>(run), dequantized->ptrs.data()),
                                          "dequantize"));
        bf16_blocks = dequantized->const_ptrs.data();
      }
      KVTIER_RETURN_IF_ERROR(FromKernel(kernels::ScatterCpu(spec, bf16_blocks, pages.data(), static_cast<int32_t>(run),
                                                            cache_.mutable_layer_pointers()),
                                        "scatter"));
    }
    result.fetched_blocks = run;
  }
  absl::Time t2 = absl::Now();
  result.fetch_time = t2 - t1;

  // 3. Prefill from the hit, keeping at least the last position to produce its logits. When every
  // token is cached the last one is recomputed over its own restored row (same bits for codec none).
  result.computed_from = std::min(result.fetched_blocks * block_tokens, static_cast<uint32_t>(n - 1));
  KVTIER_ASSIGN_OR_RETURN(result.logits,
                          model_.Prefill(prompt, static_cast<int32_t>(result.computed_from), pages, cache_));
  absl::Time t3 = absl::Now();
  result.compute_time = t3 - t2;

  // 4. Store the blocks completed by this prefill: [fetched_blocks, full_blocks).
  if (client_ != nullptr && result.full_blocks > result.fetched_blocks) {
    const uint32_t first = result.fetched_blocks;
    const uint32_t count = result.full_blocks - first;
    Buffers gathered(count, static_cast<uint64_t>(spec.BlockBytes()));
    KVTIER_RETURN_IF_ERROR(FromKernel(
        kernels::GatherCpu(spec, cache_.layer_pointers(), pages.data() + static_cast<int64_t>(first) * pages_per_block,
                           static_cast<int32_t>(count), gathered.ptrs.data()),
        "gather"));
    const Buffers* to_put = &gathered;
    std::unique_ptr<Buffers> packed;
    if (quantized) {
      packed = std::make_unique<Buffers>(count, shard_bytes);
      KVTIER_RETURN_IF_ERROR(FromKernel(kernels::QuantizeCpu(QuantSpecOf(options_), gathered.const_ptrs.data(),
                                                             static_cast<int32_t>(count), packed->ptrs.data()),
                                        "quantize"));
      to_put = packed.get();
    }
    KVTIER_ASSIGN_OR_RETURN(std::vector<client::PutResult> put,
                            client_->Put(ns_, std::span(fps).subspan(first, count), 0, to_put->const_spans, first));
    result.put_blocks = count;
    for (client::PutResult r : put) {
      if (r == client::PutResult::kStored || r == client::PutResult::kAlreadyPresent) ++result.stored_blocks;
    }
  }
  result.store_time = absl::Now() - t3;
  return result;
}

}  // namespace kvtier::reference_worker
