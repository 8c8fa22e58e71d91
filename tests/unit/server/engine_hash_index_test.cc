// EngineHashIndex: engine hash -> block keys from the sink calls, forwarded unchanged to the next sink.
#include "query/engine_hash_index.h"

#include <memory>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "kvtier/server/block_store.h"

namespace kvtier::server {
namespace {

BlockKey Key(uint8_t b, uint32_t shard = 0) {
  BlockKey k;
  k.fingerprint.bytes.fill(b);
  k.shard = shard;
  return k;
}

EventBlockInfo Block(const BlockKey& key, EngineBlockHash hash) {
  auto meta = std::make_shared<BlockMeta>();
  meta->hash = std::move(hash);
  return EventBlockInfo{.key = key, .tier = Tier::kHost, .block_meta = meta};
}

// Counts what reaches it.
class CountingSink final : public BlockEventSink {
 public:
  void OnStored(const EventBlockInfo&) override { ++stored; }
  void OnRemoved(const EventBlockInfo&) override { ++removed; }
  void OnMoved(const EventBlockInfo&, Tier) override { ++moved; }
  void OnCleared() override { ++cleared; }
  int stored = 0, removed = 0, moved = 0, cleared = 0;
};

TEST(EngineHashIndexTest, FindsTheKeysOfAHashUntilTheyAreRemovedOrCleared) {
  CountingSink next;
  EngineHashIndex index(&next);
  index.OnStored(Block(Key(1, 0), EngineBlockHash::Uint(7)));
  index.OnStored(Block(Key(1, 1), EngineBlockHash::Uint(7)));  // the block's second TP shard
  index.OnStored(Block(Key(1, 1), EngineBlockHash::Uint(7)));  // a restatement: no duplicate
  index.OnStored(Block(Key(2), EngineBlockHash::Int(-7)));
  index.OnStored(Block(Key(3), EngineBlockHash::Bytes(std::string(8, '\x07'))));
  index.OnStored(EventBlockInfo{.key = Key(4)});  // no metadata: not indexed
  EXPECT_EQ(index.size(), 3u);
  EXPECT_EQ(index.Find(EngineBlockHash::Uint(7)), (std::vector<BlockKey>{Key(1, 0), Key(1, 1)}));
  EXPECT_EQ(index.Find(EngineBlockHash::Int(-7)), (std::vector<BlockKey>{Key(2)}));
  // The same 8 bytes as an integer are another hash.
  EXPECT_EQ(index.Find(EngineBlockHash::Bytes(std::string(8, '\x07'))), (std::vector<BlockKey>{Key(3)}));
  EXPECT_TRUE(index.Find(EngineBlockHash::Uint(0x0707070707070707ULL)).empty());
  EXPECT_TRUE(index.Find(EngineBlockHash{}).empty());

  index.OnMoved(Block(Key(2), EngineBlockHash::Int(-7)), Tier::kHost);  // a move keeps it
  EXPECT_EQ(index.Find(EngineBlockHash::Int(-7)).size(), 1u);
  index.OnRemoved(Block(Key(1, 0), EngineBlockHash::Uint(7)));
  EXPECT_EQ(index.Find(EngineBlockHash::Uint(7)), (std::vector<BlockKey>{Key(1, 1)}));
  index.OnCleared();
  EXPECT_EQ(index.size(), 0u);
  EXPECT_EQ(next.stored, 6);
  EXPECT_EQ(next.removed, 1);
  EXPECT_EQ(next.moved, 1);
  EXPECT_EQ(next.cleared, 1);
}

TEST(EngineHashIndexTest, WorksWithoutANextSink) {
  EngineHashIndex index(nullptr);
  index.OnStored(Block(Key(9), EngineBlockHash::Uint(1)));
  index.OnMoved(Block(Key(9), EngineBlockHash::Uint(1)), Tier::kDisk);
  index.OnRemoved(Block(Key(9), EngineBlockHash::Uint(1)));
  index.OnCleared();
  EXPECT_EQ(index.size(), 0u);
}

}  // namespace
}  // namespace kvtier::server
