#include "events/vllm_encoder.h"

#include <bit>
#include <cstring>

namespace kvtier::server {

const char* VllmMedium(Tier tier) {
  switch (tier) {
    case Tier::kHbm:
      return "GPU";
    case Tier::kHost:
      return "CPU";
    case Tier::kDisk:
      return "DISK";
  }
  return "CPU";
}

uint64_t VllmIntBlockHash(const Fingerprint& fp) {
  uint64_t v = 0;
  for (size_t i = fp.bytes.size() - 8; i < fp.bytes.size(); ++i) v = (v << 8) | fp.bytes[i];
  return v;
}

void MsgpackWriter::BigEndian(uint64_t v, int bytes) {
  for (int i = bytes - 1; i >= 0; --i) out_->push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

void MsgpackWriter::Nil() { out_->push_back(static_cast<char>(0xc0)); }

void MsgpackWriter::Uint(uint64_t v) {
  if (v < 0x80) {
    out_->push_back(static_cast<char>(v));
  } else if (v <= 0xff) {
    out_->push_back(static_cast<char>(0xcc));
    BigEndian(v, 1);
  } else if (v <= 0xffff) {
    out_->push_back(static_cast<char>(0xcd));
    BigEndian(v, 2);
  } else if (v <= 0xffffffffULL) {
    out_->push_back(static_cast<char>(0xce));
    BigEndian(v, 4);
  } else {
    out_->push_back(static_cast<char>(0xcf));
    BigEndian(v, 8);
  }
}

void MsgpackWriter::Int(int64_t v) {
  if (v >= 0) return Uint(static_cast<uint64_t>(v));
  const auto u = static_cast<uint64_t>(v);
  if (v >= -32) {
    out_->push_back(static_cast<char>(u & 0xff));
  } else if (v >= INT8_MIN) {
    out_->push_back(static_cast<char>(0xd0));
    BigEndian(u, 1);
  } else if (v >= INT16_MIN) {
    out_->push_back(static_cast<char>(0xd1));
    BigEndian(u, 2);
  } else if (v >= INT32_MIN) {
    out_->push_back(static_cast<char>(0xd2));
    BigEndian(u, 4);
  } else {
    out_->push_back(static_cast<char>(0xd3));
    BigEndian(u, 8);
  }
}

void MsgpackWriter::Float64(double v) {
  out_->push_back(static_cast<char>(0xcb));
  BigEndian(std::bit_cast<uint64_t>(v), 8);
}

void MsgpackWriter::Str(std::string_view s) {
  const uint64_t n = s.size();
  if (n < 32) {
    out_->push_back(static_cast<char>(0xa0 | n));
  } else if (n <= 0xff) {
    out_->push_back(static_cast<char>(0xd9));
    BigEndian(n, 1);
  } else if (n <= 0xffff) {
    out_->push_back(static_cast<char>(0xda));
    BigEndian(n, 2);
  } else {
    out_->push_back(static_cast<char>(0xdb));
    BigEndian(n, 4);
  }
  out_->append(s);
}

void MsgpackWriter::Bin(std::string_view b) {
  const uint64_t n = b.size();
  if (n <= 0xff) {
    out_->push_back(static_cast<char>(0xc4));
    BigEndian(n, 1);
  } else if (n <= 0xffff) {
    out_->push_back(static_cast<char>(0xc5));
    BigEndian(n, 2);
  } else {
    out_->push_back(static_cast<char>(0xc6));
    BigEndian(n, 4);
  }
  out_->append(b);
}

void MsgpackWriter::ArrayHeader(uint32_t n) {
  if (n < 16) {
    out_->push_back(static_cast<char>(0x90 | n));
  } else if (n <= 0xffff) {
    out_->push_back(static_cast<char>(0xdc));
    BigEndian(n, 2);
  } else {
    out_->push_back(static_cast<char>(0xdd));
    BigEndian(n, 4);
  }
}

void MsgpackWriter::MapHeader(uint32_t n) {
  if (n < 16) {
    out_->push_back(static_cast<char>(0x80 | n));
  } else if (n <= 0xffff) {
    out_->push_back(static_cast<char>(0xde));
    BigEndian(n, 2);
  } else {
    out_->push_back(static_cast<char>(0xdf));
    BigEndian(n, 4);
  }
}

namespace {

// An engine hash as msgpack: the integer in its shortest form, or bin. False for an empty hash.
bool EngineHash(MsgpackWriter& w, const EngineBlockHash& h) {
  switch (h.form) {
    case EngineBlockHash::Form::kNone:
      return false;
    case EngineBlockHash::Form::kInt:
      w.Int(h.int_value);
      return true;
    case EngineBlockHash::Form::kUint:
      w.Uint(h.uint_value);
      return true;
    case EngineBlockHash::Form::kBytes:
      w.Bin(h.bytes);
      return true;
  }
  return false;
}

const BlockMeta* MetaAt(const VllmEvent& e, size_t i) {
  return i < e.block_meta.size() ? e.block_meta[i].get() : nullptr;
}

// A kvtier fingerprint as a vLLM block hash, in the configured form.
void FingerprintHash(MsgpackWriter& w, const Fingerprint& fp, VllmBlockHashForm form) {
  if (form == VllmBlockHashForm::kInt) {
    w.Uint(VllmIntBlockHash(fp));
  } else {
    w.Bin(std::string_view(reinterpret_cast<const char*>(fp.bytes.data()), fp.bytes.size()));
  }
}

void BlockHashes(MsgpackWriter& w, const VllmEvent& e, VllmBlockHashForm form) {
  w.ArrayHeader(static_cast<uint32_t>(e.block_hashes.size()));
  for (size_t i = 0; i < e.block_hashes.size(); ++i) {
    if (const BlockMeta* m = MetaAt(e, i); m != nullptr && EngineHash(w, m->hash)) continue;
    FingerprintHash(w, e.block_hashes[i], form);
  }
}

// The first block's parent in the terms its own hash is in: the parent's engine hash when the block is
// named by an engine hash, the parent's fingerprint when it is named by its fingerprint; nil when that
// is not known (the chain's first block, or a writer that did not say).
void ParentBlockHash(MsgpackWriter& w, const BlockMeta* first, VllmBlockHashForm form) {
  if (first == nullptr) {
    w.Nil();
  } else if (!first->hash.empty()) {
    if (!EngineHash(w, first->parent_hash)) w.Nil();
  } else if (first->parent_fingerprint.has_value()) {
    FingerprintHash(w, *first->parent_fingerprint, form);
  } else {
    w.Nil();
  }
}

}  // namespace

std::string EncodeVllmBatch(double ts, const std::vector<VllmEvent>& events, std::optional<int64_t> data_parallel_rank,
                            VllmBlockHashForm hash_form, VllmEncoding encoding, const VllmEnvelope& envelope) {
  std::string out;
  out.reserve(16 + events.size() * 64);
  MsgpackWriter w(&out);
  const bool map = encoding == VllmEncoding::kMap;
  // A struct of n fields; in the map form each value is preceded by its name.
  const bool credited = map && !envelope.instance_ids.empty();
  auto begin = [&](uint32_t n) { map ? w.MapHeader(n) : w.ArrayHeader(n); };
  // An event struct of n fields, plus the envelope's two in the credited map form.
  auto begin_event = [&](uint32_t n) { begin(credited ? n + 2 : n); };
  auto credit = [&] {
    if (!credited) return;
    w.Str("backend_id");
    w.Str(envelope.backend_id);
    w.Str("instance_ids");
    w.ArrayHeader(static_cast<uint32_t>(envelope.instance_ids.size()));
    for (const std::string& id : envelope.instance_ids) w.Str(id);
  };
  auto key = [&](std::string_view name) {
    if (map) w.Str(name);
  };
  auto tag = [&](std::string_view name) {
    key("type");
    w.Str(name);
  };
  begin(data_parallel_rank.has_value() ? 3 : 2);
  key("ts");
  w.Float64(ts);
  key("events");
  w.ArrayHeader(static_cast<uint32_t>(events.size()));
  for (const VllmEvent& e : events) {
    switch (e.kind) {
      case VllmEvent::Kind::kStored: {
        const BlockMeta* first = MetaAt(e, 0);
        begin_event(8);
        tag("BlockStored");
        key("block_hashes");
        BlockHashes(w, e, hash_form);
        key("parent_block_hash");
        ParentBlockHash(w, first, hash_form);
        key("token_ids");
        size_t tokens = 0;
        for (size_t i = 0; i < e.block_hashes.size(); ++i) {
          if (const BlockMeta* m = MetaAt(e, i); m != nullptr) tokens += m->token_ids.size();
        }
        w.ArrayHeader(static_cast<uint32_t>(tokens));
        for (size_t i = 0; i < e.block_hashes.size(); ++i) {
          if (const BlockMeta* m = MetaAt(e, i); m != nullptr) {
            for (uint32_t t : m->token_ids) w.Uint(t);
          }
        }
        key("block_size");
        w.Uint(first != nullptr && !first->token_ids.empty() ? first->token_ids.size() : e.block_size);
        key("lora_id");
        if (first != nullptr && first->lora_id.has_value()) {
          w.Int(*first->lora_id);
        } else {
          w.Nil();
        }
        key("medium");
        w.Str(e.medium);
        key("lora_name");
        w.Nil();
        credit();
        break;
      }
      case VllmEvent::Kind::kRemoved:
        begin_event(3);
        tag("BlockRemoved");
        key("block_hashes");
        BlockHashes(w, e, hash_form);
        key("medium");
        w.Str(e.medium);
        credit();
        break;
      case VllmEvent::Kind::kCleared:
        begin_event(1);
        tag("AllBlocksCleared");
        credit();
        break;
    }
  }
  if (data_parallel_rank.has_value()) {
    key("data_parallel_rank");
    w.Int(*data_parallel_rank);
  }
  return out;
}

}  // namespace kvtier::server
