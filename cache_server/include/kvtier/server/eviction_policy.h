// Eviction policies: which committed, unleased block to drop when a tier is full.
#ifndef KVTIER_SERVER_EVICTION_POLICY_H_
#define KVTIER_SERVER_EVICTION_POLICY_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace kvtier::server {

// Dense handle of an index entry (BlockStore reuses handles after erase).
using EntryHandle = uint32_t;

// What a policy learns of each insert and access. A KV cache knows more than a generic cache: where a
// block sits in its prompt's chain and which namespace (model, layout) it belongs to.
struct BlockAccess {
  uint32_t depth = 0;         // index of the block in its prompt's fingerprint chain (0 = first block)
  uint64_t namespace_id = 0;  // Namespace::Id()
  uint64_t size_bytes = 0;    // the block's bytes
  int64_t now_ns = 0;         // the store's clock at the access, ns since the Unix epoch
  // A hash of the block's key that is the same at every access of the block and differs between
  // blocks (e.g. the first 8 bytes of the fingerprint mixed with the shard); 0 = not given. Handles are
  // reused after erase, so this is how a policy recognises a block that comes back (prefix_lrfu).
  uint64_t key_hash = 0;
};

// Tracks the entries of one tier and orders them as eviction candidates. The store calls OnInsert when
// a block becomes visible, OnAccess on every hit or repeated put, OnErase when it leaves the tier.
// Thread-safety: none; the owning store serialises calls.
class EvictionPolicy {
 public:
  virtual ~EvictionPolicy() = default;
  virtual void OnInsert(EntryHandle h, const BlockAccess& access) = 0;
  virtual void OnAccess(EntryHandle h, const BlockAccess& access) = 0;
  virtual void OnErase(EntryHandle h) = 0;
  // Offers candidates from the best victim onward to `eligible` and returns the first it accepts, or
  // nullopt when it accepts none (e.g. everything is leased). Does not remove the victim.
  virtual std::optional<EntryHandle> PickVictim(absl::FunctionRef<bool(EntryHandle)> eligible) = 0;
  virtual const char* name() const = 0;
};

// Settings of the policies that take any. Every field has a default, so `{}` is valid.
struct EvictionPolicyOptions {
  // weighted: the weights of its two terms (see NewWeightedPolicy). Operators give them as
  // "frequency, recency", e.g. 0.3, 0.7. Each finite and >= 0, not both 0.
  double frequency_weight = 0.3;  // Default: 0.3
  double recency_weight = 0.7;    // Default: 0.7
  // Errors: InvalidArgument naming the bad field.
  absl::Status Validate() const;
};

// "lru", the default. Least recently used: an intrusive doubly linked list over entry handles. O(1) per
// call, plus the candidates skipped in PickVictim. Knows nothing of chains: a prompt's blocks are
// touched first to last, so its first block is the least recent of them and goes first.
std::unique_ptr<EvictionPolicy> NewLruPolicy();

// "weighted": evicts the entry with the lowest
//     score = recency_weight x recency + frequency_weight x frequency,
// both terms in [0, 1] and normalised over the entries resident when the victim is picked:
//   - recency = (s - s_oldest) / (clock - s_oldest), where the clock counts OnInsert/OnAccess calls and s
//     is the entry's start: the clock at its last touch minus its depth, i.e. about the clock at which
//     its prompt's first block was touched, so the blocks of one prompt are equally recent; s_oldest is
//     the smallest s resident. 1 = touched by the latest prompt, 0 = the least recent entry (1 for all
//     when every entry has the same s).
//   - frequency = log2(1 + q(n)) / log2(1 + q(n_max)), n = touches since the entry was inserted (the
//     insert is one), q(n) = n below 16 and the largest power of two <= n from 16 on, n_max the largest
//     resident n. 0 is impossible (n >= 1); 1 = the most used resident entry.
// Ties go to the deeper block (a chain loses its tail first), then the older start. Only the ratio of
// the weights matters: (0, 1) orders by recency alone (LRU by prompt), (1, 0) by count alone (LFU,
// oldest first among equal counts). O(log n) per touch (a B-tree per frequency class) and O(C) per
// victim, C <= 76 occupied classes, plus the candidates skipped.
std::unique_ptr<EvictionPolicy> NewWeightedPolicy(const EvictionPolicyOptions& options);

// "prefix_lrfu": the policy that knows it is caching prompt chains. bench/policy_sim/README.md has its
// measurements on real traces against lru, weighted and Belady's optimum.
//   - Value: LRFU. Each touch adds 1 to the block's value and the value halves every half-life H, so
//     it blends how often and how recently the block was used; for ordering the value saturates at 4
//     (a block that was hot long ago outlives a fresh one by at most 2 H). The victim has the lowest
//     value now. Time is BlockAccess::now_ns.
//   - Prefix order: all blocks of a prompt are touched at (about) the same time, and a block is touched
//     whenever its descendants are, so an ancestor's value is never below its descendants'; equal
//     values go to the deeper block. A chain is therefore consumed from its tail, and blocks whose
//     ancestor is gone (useless for a prefix hit) are rare (<0.05% of the resident set in our replays).
//   - History: the values of the last 32 x resident-count evicted blocks (at least 2048) are kept by
//     key_hash; a block that comes back resumes its decayed value instead of starting at 1, so a
//     conversation's returning prefix beats one-off blocks even when the cache is far smaller than
//     the gap between its turns. About 50 bytes per remembered block.
//   - Adaptation: H = 3.5 g / (1 + (R / 3.5 g)^8), from two measurements. g: the median reuse gap
//     (seconds between two touches of a block), on a 1/16 sample of key hashes (of handles, while
//     resident, when key_hash is 0), in a histogram that forgets with a half-life of 65536 samples.
//     R: the mean residence time, resident blocks / insert rate (Little's law). While R < 3.5 g blocks
//     do not stay long enough to be reused and H follows the workload's pace (chat turns minutes apart
//     give H of minutes, agentic tool loops about a minute, a replay sped up 10x a tenth of both); once
//     R > 3.5 g recency alone keeps reused blocks, frequency would only keep dead ones, and H falls
//     towards 0: LRU by prompt, tail first. H starts at 60 s, is revisited every max(4096, resident
//     count) touches and changes (a re-key, O(n log n)) only when it moves by more than 7%.
// O(log n) per touch and per victim (a B-tree keyed by log2(value) + t / H), plus the candidates skipped.
std::unique_ptr<EvictionPolicy> NewPrefixLrfuPolicy();

// "adaptive": follows whichever of two experts would hit more on this instance's own traffic (one
// instance per tier of a node), as measured by two miniature caches:
//   - recency: LRU by prompt; an entry's start is the touch counter at its last touch minus its depth
//     (the blocks of one prompt are equally recent), the least recent start goes first, ties to the
//     deeper block;
//   - frequency: a prefix_lrfu instance (above), with its own history and half-life.
// Both experts see every call and order all entries; PickVictim asks the one followed. The shadows:
// for 1/8 of the key hashes (a fixed hash, SHARDS-style sampling), each expert alone runs a cache of
// peak-resident-count / 8 blocks and counts its hits (a touch of a block it holds, or a block it
// holds leaving this tier other than as this policy's victim, i.e. other than by an OnErase of the entry
// the latest PickVictim named, with no call between: a promotion or a delete). The counts
// halve every 16,384 sampled touches; every 32 the policy switches to the other expert when its count
// exceeds the followed one's by 2% and 8 hits. It starts with frequency.
// A lower tier follows recency whatever the shadows say: an instance whose entries leave other than
// as its victims (promotions to the tier above, deletes) at least once per 256 inserts, over the latest
// ~65,536 inserts (from 1,024 on). Such a tier receives the upper tier's victims, whose frequency
// history it never saw, and with frequency on both tiers a disk tier lost up to 0.039 of hit ratio to
// LRU in our replays; with recency below it stays at or above LRU.
// Both experts consume chains from the tail (an ancestor is touched whenever its descendants are, ties
// go to the deeper block), so a victim has no resident descendant among the blocks of the prompts that
// touched it. Needs key_hash (0: no sampling, it stays with frequency, i.e. prefix_lrfu).
// O(log n) per touch (both experts, and both shadows for the sampled 1/8), O(log n) per victim, plus the
// candidates skipped; memory: both experts' per-entry state (prefix_lrfu's history included) plus
// the shadows, about an eighth of that again. Measurements: bench/policy_sim/README.md.
std::unique_ptr<EvictionPolicy> NewAdaptivePolicy();

// The names NewEvictionPolicy() knows, BlockStoreOptions' default ("lru") first (servers default to
// "adaptive": ServerOptions::eviction_policy).
std::vector<std::string> EvictionPolicyNames();

// The policy called `name` (one of EvictionPolicyNames()), with `options` for those that take any.
// Errors: InvalidArgument listing the known names, or naming the bad field of `options`.
absl::StatusOr<std::unique_ptr<EvictionPolicy>> NewEvictionPolicy(const std::string& name);
absl::StatusOr<std::unique_ptr<EvictionPolicy>> NewEvictionPolicy(const std::string& name,
                                                                  const EvictionPolicyOptions& options);

}  // namespace kvtier::server

#endif  // KVTIER_SERVER_EVICTION_POLICY_H_
