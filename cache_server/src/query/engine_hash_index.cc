#include "query/engine_hash_index.h"

#include <algorithm>
#include <cstring>

namespace kvtier::server {

std::string EngineHashIndex::KeyOf(const EngineBlockHash& hash) {
  std::string key(1, static_cast<char>(hash.form));
  auto append64 = [&key](uint64_t v) {
    for (int i = 0; i < 8; ++i) key.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
  };
  switch (hash.form) {
    case EngineBlockHash::Form::kNone:
      break;
    case EngineBlockHash::Form::kInt:
      append64(static_cast<uint64_t>(hash.int_value));
      break;
    case EngineBlockHash::Form::kUint:
      append64(hash.uint_value);
      break;
    case EngineBlockHash::Form::kBytes:
      key += hash.bytes;
      break;
  }
  return key;
}

void EngineHashIndex::OnStored(const EventBlockInfo& block) {
  if (block.block_meta != nullptr && !block.block_meta->hash.empty()) {
    std::lock_guard<std::mutex> lock(mu_);
    std::vector<BlockKey>& keys = by_hash_[KeyOf(block.block_meta->hash)];
    if (std::find(keys.begin(), keys.end(), block.key) == keys.end()) keys.push_back(block.key);
  }
  if (next_ != nullptr) next_->OnStored(block);
}

void EngineHashIndex::OnRemoved(const EventBlockInfo& block) {
  if (block.block_meta != nullptr && !block.block_meta->hash.empty()) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = by_hash_.find(KeyOf(block.block_meta->hash));
    if (it != by_hash_.end()) {
      std::erase(it->second, block.key);
      if (it->second.empty()) by_hash_.erase(it);
    }
  }
  if (next_ != nullptr) next_->OnRemoved(block);
}

void EngineHashIndex::OnMoved(const EventBlockInfo& block, Tier from) {
  if (next_ != nullptr) next_->OnMoved(block, from);
}

void EngineHashIndex::OnCleared() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    by_hash_.clear();
  }
  if (next_ != nullptr) next_->OnCleared();
}

std::vector<BlockKey> EngineHashIndex::Find(const EngineBlockHash& hash) const {
  if (hash.empty()) return {};
  std::lock_guard<std::mutex> lock(mu_);
  auto it = by_hash_.find(KeyOf(hash));
  return it == by_hash_.end() ? std::vector<BlockKey>{} : it->second;
}

size_t EngineHashIndex::size() const {
  std::lock_guard<std::mutex> lock(mu_);
  return by_hash_.size();
}

}  // namespace kvtier::server
