// The vLLM KV event wire format (docs/events.md, "vLLM format"): a msgpack KVEventBatch of BlockStored /
// BlockRemoved / AllBlocksCleared, encoded the way vLLM's msgspec structs encode (array_like: a struct
// is an array of its fields in declaration order; tag=True: an event's first element is its class name).
#ifndef KVTIER_SERVER_SRC_EVENTS_VLLM_ENCODER_H_
#define KVTIER_SERVER_SRC_EVENTS_VLLM_ENCODER_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "kvtier/common/block_meta.h"
#include "kvtier/common/fingerprint.h"
#include "kvtier/server/block_store.h"

namespace kvtier::server {

// How a 32-byte fingerprint becomes vLLM's ExternalBlockHash (`bytes | int`).
enum class VllmBlockHashForm : uint8_t {
  kInt,    // the fingerprint's last 8 bytes read big-endian, as an unsigned msgpack integer (what vLLM
           // emits with VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES, its default)
  kBytes,  // the 32 bytes as msgpack bin
};

// How structs are laid out. vLLM's structs declared array_like=True encode as arrays of their fields
// (with the tag first); declared without it, msgspec writes maps keyed by field name with the tag under
// "type" first. Both omit fields left at their default (omit_defaults).
enum class VllmEncoding : uint8_t { kArray, kMap };

// vLLM's `medium` for a kvtier tier: hbm -> "GPU", host -> "CPU", disk -> "DISK".
const char* VllmMedium(Tier tier);

// The ExternalBlockHash integer of `fp` (VllmBlockHashForm::kInt).
uint64_t VllmIntBlockHash(const Fingerprint& fp);

// One vLLM event. kStored and kRemoved carry one or more blocks of one medium.
struct VllmEvent {
  enum class Kind : uint8_t { kStored, kRemoved, kCleared };
  Kind kind = Kind::kCleared;
  std::vector<Fingerprint> block_hashes;
  std::string medium;       // VllmMedium(tier)
  uint32_t block_size = 0;  // BlockStored only: tokens per block
  // The engine's metadata of each block (null entries, or fewer than block_hashes: none). A block with
  // an engine hash is named by it instead of its fingerprint; BlockStored's parent_block_hash, token_ids
  // (all blocks' tokens, in order), lora_id and block_size (the first block's token count, when it has
  // tokens) come from it.
  std::vector<std::shared_ptr<const BlockMeta>> block_meta;
};

// Appends msgpack values to a byte string, each in its shortest form (as msgspec writes them; floats
// always as float64). Not thread-safe; cheap to create.
class MsgpackWriter {
 public:
  explicit MsgpackWriter(std::string* out) : out_(out) {}
  void Nil();
  void Uint(uint64_t v);
  void Int(int64_t v);
  void Float64(double v);
  void Str(std::string_view s);
  void Bin(std::string_view b);
  void ArrayHeader(uint32_t n);
  void MapHeader(uint32_t n);  // n key-value pairs follow

 private:
  void BigEndian(uint64_t v, int bytes);
  std::string* out_;
};

// Who an event is credited to, in the form of the Mooncake/Dynamo KV event envelope (docs/events.md):
// map-form events with instance_ids set carry "backend_id" (the kvtier node holding the blocks) and
// "instance_ids" (the engine instances that can read them) after their vLLM fields. Array-form events
// never do (vLLM's array layout is positional).
struct VllmEnvelope {
  std::string backend_id;
  std::vector<std::string> instance_ids;  // empty: no envelope fields
};

// Encodes KVEventBatch (ts, events, data_parallel_rank; data_parallel_rank omitted when nullopt, as
// omit_defaults does for its None default). `ts` is seconds since the Unix epoch. Field order, array form:
// BlockStored [tag, block_hashes, parent_block_hash (nil, or the first block's engine parent hash),
// token_ids ([], or the engine's), block_size, lora_id (nil, or the engine's), medium, lora_name (nil)]; BlockRemoved
// [tag, block_hashes, medium]; AllBlocksCleared [tag]. The map form has the same fields under their names after "type":
// the tag.
std::string EncodeVllmBatch(double ts, const std::vector<VllmEvent>& events, std::optional<int64_t> data_parallel_rank,
                            VllmBlockHashForm hash_form, VllmEncoding encoding = VllmEncoding::kArray,
                            const VllmEnvelope& envelope = {});

}  // namespace kvtier::server

#endif  // KVTIER_SERVER_SRC_EVENTS_VLLM_ENCODER_H_
