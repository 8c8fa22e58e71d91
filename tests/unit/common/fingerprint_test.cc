#include "kvtier/common/fingerprint.h"

#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/hash/hash.h"
#include "absl/status/status.h"
#include "gtest/gtest.h"
#include "kvtier/common/block_key.h"
#include "kvtier/common/hash_ring.h"
#include "kvtier/common/kv_layout.h"
#include "kvtier/common/namespace.h"

namespace kvtier {
namespace {

// --- Helpers ----------------------------------------------------------------------------------------

Namespace Llama8b() {
  Namespace ns;
  ns.tenant = "acme";
  ns.model = "meta-llama/Llama-3.1-8B";
  ns.layout = {.kind = LayoutKind::kStandard,
               .dtype = DType::kBf16,
               .codec = Codec::kNone,
               .num_layers = 32,
               .num_kv_heads = 8,
               .head_dim = 128,
               .latent_dim = 0,
               .block_tokens = 16,
               .tp_size = 1,
               .quant_group_size = 64};
  return ns;
}

std::vector<uint32_t> Tokens(size_t count, uint32_t seed = 1) {
  std::vector<uint32_t> tokens(count);
  for (size_t i = 0; i < count; ++i) {
    tokens[i] = static_cast<uint32_t>((i * 2654435761u + seed * 97u) % 128256u);
  }
  return tokens;
}

std::vector<Fingerprint> Chain(const Namespace& ns, const std::vector<uint32_t>& tokens, const ExtraKeys& extra = {}) {
  absl::StatusOr<std::vector<Fingerprint>> fps = ChainFingerprints(ns, tokens, extra);
  EXPECT_TRUE(fps.ok()) << fps.status();
  return fps.ok() ? *std::move(fps) : std::vector<Fingerprint>{};
}

std::string HexList(const std::vector<Fingerprint>& fps) {
  std::string out;
  for (size_t i = 0; i < fps.size(); ++i) out += (i == 0 ? "" : ",") + fps[i].Hex();
  return out;
}

// --- The golden vectors (tests/data/fingerprint_golden.txt; format in docs/fingerprints.md) --------

std::filesystem::path GoldenPath() {
  if (const char* source_dir = std::getenv("KVTIER_SOURCE_DIR"); source_dir != nullptr && *source_dir != '\0') {
    return std::filesystem::path(source_dir) / "tests/data/fingerprint_golden.txt";
  }
  // This file is <repo>/tests/unit/common/fingerprint_test.cc.
  return std::filesystem::path(__FILE__).parent_path().parent_path().parent_path() / "data/fingerprint_golden.txt";
}

struct GoldenRecord {
  std::string type;  // fp, ring or vnode
  std::map<std::string, std::string> fields;
  const std::string& at(const std::string& key) const {
    static const std::string kMissing = "<missing>";
    auto it = fields.find(key);
    if (it == fields.end()) {
      ADD_FAILURE() << "golden record " << type << " " << fields.count("name") << " lacks " << key;
      return kMissing;
    }
    return it->second;
  }
};

std::vector<GoldenRecord> ReadGolden() {
  std::ifstream in(GoldenPath());
  EXPECT_TRUE(in.good()) << "cannot open " << GoldenPath();
  std::vector<GoldenRecord> records;
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#') continue;
    std::istringstream words(line);
    GoldenRecord record;
    words >> record.type;
    std::string word;
    while (words >> word) {
      const size_t eq = word.find('=');
      EXPECT_NE(eq, std::string::npos) << word;
      record.fields[word.substr(0, eq)] = word.substr(eq + 1);
    }
    records.push_back(std::move(record));
  }
  return records;
}

std::vector<std::string> Split(const std::string& s, char sep) {
  std::vector<std::string> parts;
  if (s.empty()) return parts;
  size_t begin = 0;
  while (true) {
    const size_t end = s.find(sep, begin);
    parts.push_back(s.substr(begin, end - begin));
    if (end == std::string::npos) return parts;
    begin = end + 1;
  }
}

std::string Unhex(const std::string& hex) {
  EXPECT_EQ(hex.size() % 2, 0u) << hex;
  std::string out;
  for (size_t i = 0; i + 1 < hex.size(); i += 2) {
    out.push_back(static_cast<char>(std::stoi(hex.substr(i, 2), nullptr, 16)));
  }
  return out;
}

std::optional<std::string> UnhexOptional(const std::string& hex) {
  if (hex == "-") return std::nullopt;
  return Unhex(hex);
}

std::string Hex(const std::string& bytes) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string out;
  for (unsigned char c : bytes) {
    out.push_back(kDigits[c >> 4]);
    out.push_back(kDigits[c & 0xf]);
  }
  return out;
}

std::vector<uint32_t> GoldenTokens(const std::string& spec) {
  std::vector<uint32_t> tokens;
  if (spec.rfind("list:", 0) == 0) {
    for (const std::string& t : Split(spec.substr(5), ',')) {
      tokens.push_back(static_cast<uint32_t>(std::stoul(t)));
    }
  } else if (spec.rfind("lcg:", 0) == 0) {
    const std::vector<std::string> parts = Split(spec.substr(4), ':');
    EXPECT_EQ(parts.size(), 2u) << spec;
    uint64_t x = std::stoull(parts[0]);
    const size_t count = std::stoul(parts[1]);
    for (size_t i = 0; i < count; ++i) {
      x = x * 6364136223846793005ULL + 1442695040888963407ULL;  // mod 2^64
      tokens.push_back(static_cast<uint32_t>((x >> 33) % 128256));
    }
  } else {
    ADD_FAILURE() << "bad tokens field " << spec;
  }
  return tokens;
}

void ParseGoldenFp(const GoldenRecord& r, Namespace* ns, ExtraKeys* extra) {
  ns->tenant = Unhex(r.at("tenant"));
  ns->model = Unhex(r.at("model"));
  ns->revision = UnhexOptional(r.at("revision"));
  ns->tenant_salt = UnhexOptional(r.at("tenant_salt"));
  KvLayout& l = ns->layout;
  l.kind = ParseLayoutKind(r.at("kind")).value();
  l.dtype = ParseDType(r.at("dtype")).value();
  l.codec = ParseCodec(r.at("codec")).value();
  l.num_layers = std::stoul(r.at("layers"));
  l.num_kv_heads = std::stoul(r.at("kv_heads"));
  l.head_dim = std::stoul(r.at("head_dim"));
  l.latent_dim = std::stoul(r.at("latent_dim"));
  l.block_tokens = std::stoul(r.at("block_tokens"));
  l.tp_size = std::stoul(r.at("tp"));
  l.quant_group_size = std::stoul(r.at("group"));
  if (r.at("lora") != "-") {
    const std::vector<std::string> parts = Split(r.at("lora"), ':');
    EXPECT_EQ(parts.size(), 2u);
    extra->lora = LoraKey{.adapter_id = Unhex(parts[0]), .version = std::stoull(parts[1])};
  }
  for (const std::string& item : Split(r.at("mm"), ',')) {
    const std::vector<std::string> parts = Split(item, ':');
    EXPECT_EQ(parts.size(), 3u) << item;
    extra->multimodal.push_back({.content_hash = Unhex(parts[0]),
                                 .offset_tokens = static_cast<uint32_t>(std::stoul(parts[1])),
                                 .length_tokens = static_cast<uint32_t>(std::stoul(parts[2]))});
  }
  extra->cache_salt = UnhexOptional(r.at("cache_salt"));
}

Fingerprint AtRingPosition(uint64_t position) {
  Fingerprint fp;
  for (int i = 0; i < 8; ++i) fp.bytes[i] = static_cast<uint8_t>(position >> (8 * i));
  return fp;
}

TEST(GoldenVectorsTest, FileHasVectorsOfEveryKind) {
  std::map<std::string, int> counts;
  for (const GoldenRecord& r : ReadGolden()) ++counts[r.type];
  EXPECT_GE(counts["fp"], 20);
  EXPECT_GE(counts["ring"], 5);
  EXPECT_GE(counts["vnode"], 2);
}

TEST(GoldenVectorsTest, CppMatchesEveryFingerprintVector) {
  int checked = 0;
  for (const GoldenRecord& r : ReadGolden()) {
    if (r.type != "fp") continue;
    SCOPED_TRACE(r.at("name"));
    Namespace ns;
    ExtraKeys extra;
    ParseGoldenFp(r, &ns, &extra);
    EXPECT_EQ(Hex(ns.CanonicalBytes()), r.at("canonical"));
    EXPECT_EQ(std::to_string(ns.Id()), r.at("ns_id"));
    absl::StatusOr<std::vector<Fingerprint>> fps = ChainFingerprints(ns, GoldenTokens(r.at("tokens")), extra);
    ASSERT_TRUE(fps.ok()) << fps.status();
    EXPECT_EQ(HexList(*fps), r.at("fps"));
    ++checked;
  }
  EXPECT_GE(checked, 20);
}

TEST(GoldenVectorsTest, CppMatchesEveryRingVector) {
  int checked = 0;
  for (const GoldenRecord& r : ReadGolden()) {
    if (r.type != "ring") continue;
    SCOPED_TRACE(r.at("name"));
    std::vector<std::string> members;
    for (const std::string& m : Split(r.at("members"), ',')) members.push_back(Unhex(m));
    absl::StatusOr<HashRing> ring = HashRing::Create(members, std::stoul(r.at("vnodes")));
    ASSERT_TRUE(ring.ok()) << ring.status();
    absl::StatusOr<Fingerprint> fp = Fingerprint::FromHex(r.at("fp"));
    ASSERT_TRUE(fp.ok()) << fp.status();
    EXPECT_EQ(std::to_string(fp->RingPosition()), r.at("position"));
    std::string owners;
    for (uint32_t owner : ring->Owners(*fp, static_cast<uint32_t>(members.size()))) {
      owners += (owners.empty() ? "" : ",") + std::to_string(owner);
    }
    EXPECT_EQ(owners, r.at("owners"));
    ++checked;
  }
  EXPECT_GE(checked, 5);
}

TEST(GoldenVectorsTest, VirtualNodeAtExactlyABlocksPositionOwnsIt) {
  // HashRing does not expose its points, so place a block exactly on each golden virtual node in a
  // ring of 32 members: the node's member must own it (1/32 odds of passing by luck, per vector).
  int checked = 0;
  for (const GoldenRecord& r : ReadGolden()) {
    if (r.type != "vnode") continue;
    SCOPED_TRACE(r.at("name"));
    const std::string member = Unhex(r.at("member"));
    std::vector<std::string> members = {member};
    for (int k = 0; k < 31; ++k) members.push_back("other-" + std::to_string(k));
    const uint32_t index = std::stoul(r.at("index"));
    absl::StatusOr<HashRing> ring = HashRing::Create(members, std::max<uint32_t>(128, index + 1));
    ASSERT_TRUE(ring.ok()) << ring.status();
    EXPECT_EQ(ring->Primary(AtRingPosition(std::stoull(r.at("position")))), 0u);
    ++checked;
  }
  EXPECT_GE(checked, 2);
}

// --- Every key component is in the fingerprint --------------------------------------------------------

TEST(ChainFingerprintsTest, EveryKeyComponentChangesTheFingerprint) {
  const std::vector<uint32_t> tokens = Tokens(64);
  ExtraKeys base_extra;
  base_extra.lora = LoraKey{.adapter_id = "adapter", .version = 1};
  base_extra.multimodal = {{.content_hash = "image", .offset_tokens = 4, .length_tokens = 8}};
  base_extra.cache_salt = "salt";
  Namespace base = Llama8b();
  base.revision = "main";
  base.tenant_salt = "pepper";

  using Mutation = std::function<void(Namespace&, ExtraKeys&)>;
  const std::vector<std::pair<std::string, Mutation>> mutations = {
      {"tenant", [](Namespace& ns, ExtraKeys&) { ns.tenant = "globex"; }},
      {"tenant_salt value", [](Namespace& ns, ExtraKeys&) { ns.tenant_salt = "paprika"; }},
      {"tenant_salt absent", [](Namespace& ns, ExtraKeys&) { ns.tenant_salt.reset(); }},
      {"model", [](Namespace& ns, ExtraKeys&) { ns.model = "meta-llama/Llama-3.1-70B"; }},
      {"revision value", [](Namespace& ns, ExtraKeys&) { ns.revision = "v2"; }},
      {"revision absent", [](Namespace& ns, ExtraKeys&) { ns.revision.reset(); }},
      {"kind",
       [](Namespace& ns, ExtraKeys&) {
         ns.layout.kind = LayoutKind::kMla;
         ns.layout.latent_dim = 512;
       }},
      {"dtype", [](Namespace& ns, ExtraKeys&) { ns.layout.dtype = DType::kFp16; }},
      {"codec", [](Namespace& ns, ExtraKeys&) { ns.layout.codec = Codec::kInt8; }},
      {"num_layers", [](Namespace& ns, ExtraKeys&) { ns.layout.num_layers = 33; }},
      {"num_kv_heads", [](Namespace& ns, ExtraKeys&) { ns.layout.num_kv_heads = 16; }},
      {"head_dim", [](Namespace& ns, ExtraKeys&) { ns.layout.head_dim = 64; }},
      {"block_tokens", [](Namespace& ns, ExtraKeys&) { ns.layout.block_tokens = 32; }},
      {"tp_size", [](Namespace& ns, ExtraKeys&) { ns.layout.tp_size = 2; }},
      {"lora id", [](Namespace&, ExtraKeys& e) { e.lora->adapter_id = "adapter2"; }},
      {"lora version", [](Namespace&, ExtraKeys& e) { e.lora->version = 2; }},
      {"lora absent", [](Namespace&, ExtraKeys& e) { e.lora.reset(); }},
      {"multimodal hash", [](Namespace&, ExtraKeys& e) { e.multimodal[0].content_hash = "image2"; }},
      {"multimodal offset", [](Namespace&, ExtraKeys& e) { e.multimodal[0].offset_tokens = 5; }},
      {"multimodal length", [](Namespace&, ExtraKeys& e) { e.multimodal[0].length_tokens = 9; }},
      {"multimodal absent", [](Namespace&, ExtraKeys& e) { e.multimodal.clear(); }},
      {"cache_salt value", [](Namespace&, ExtraKeys& e) { e.cache_salt = "other"; }},
      {"cache_salt absent", [](Namespace&, ExtraKeys& e) { e.cache_salt.reset(); }},
      {"a token", [](Namespace&, ExtraKeys&) {}},  // handled below
  };
  const std::vector<Fingerprint> base_fps = Chain(base, tokens, base_extra);
  ASSERT_EQ(base_fps.size(), 4u);
  std::set<Fingerprint> seen = {base_fps[0]};
  for (const auto& [what, mutate] : mutations) {
    Namespace ns = base;
    ExtraKeys extra = base_extra;
    mutate(ns, extra);
    std::vector<uint32_t> t = tokens;
    if (what == "a token") t[15] ^= 1;  // the last token of block 0
    const std::vector<Fingerprint> fps = Chain(ns, t, extra);
    ASSERT_FALSE(fps.empty()) << what;
    EXPECT_NE(fps[0], base_fps[0]) << what;
    // Changing block 0 changes every block after it, through the chain.
    for (size_t i = 1; i < std::min(fps.size(), base_fps.size()); ++i) EXPECT_NE(fps[i], base_fps[i]) << what;
    EXPECT_TRUE(seen.insert(fps[0]).second) << what << " collides with another mutation";
  }
}

TEST(ChainFingerprintsTest, AbsentDiffersFromEmpty) {
  const std::vector<uint32_t> tokens = Tokens(16);
  Namespace ns = Llama8b();
  const Fingerprint absent = Chain(ns, tokens)[0];

  Namespace empty_revision = ns;
  empty_revision.revision = "";
  EXPECT_NE(Chain(empty_revision, tokens)[0], absent);
  EXPECT_NE(empty_revision.CanonicalBytes(), ns.CanonicalBytes());

  Namespace empty_salt = ns;
  empty_salt.tenant_salt = "";
  EXPECT_NE(Chain(empty_salt, tokens)[0], absent);
  EXPECT_EQ(empty_salt.CanonicalBytes(), ns.CanonicalBytes());  // the salt is not in the canonical bytes

  ExtraKeys empty_cache_salt;
  empty_cache_salt.cache_salt = "";
  EXPECT_NE(Chain(ns, tokens, empty_cache_salt)[0], absent);

  // And the three "empty" variants differ from one another.
  EXPECT_NE(Chain(empty_revision, tokens)[0], Chain(empty_salt, tokens)[0]);
  EXPECT_NE(Chain(empty_salt, tokens)[0], Chain(ns, tokens, empty_cache_salt)[0]);
}

TEST(ChainFingerprintsTest, LayoutFieldsThatDoNotShapeTheBlockAreNormalisedAway) {
  const std::vector<uint32_t> tokens = Tokens(32);
  // Without a quantized codec, quant_group_size is unused.
  Namespace plain = Llama8b();
  Namespace other_group = plain;
  other_group.layout.quant_group_size = 128;
  EXPECT_EQ(Chain(plain, tokens), Chain(other_group, tokens));
  EXPECT_EQ(plain.Id(), other_group.Id());
  // With one, it is used.
  plain.layout.codec = Codec::kInt8;
  other_group.layout.codec = Codec::kInt8;
  EXPECT_NE(Chain(plain, tokens), Chain(other_group, tokens));

  // latent_dim is unused by standard attention; num_kv_heads and head_dim by MLA.
  Namespace standard = Llama8b();
  Namespace standard_latent = standard;
  standard_latent.layout.latent_dim = 512;
  EXPECT_EQ(Chain(standard, tokens), Chain(standard_latent, tokens));
  Namespace mla = Llama8b();
  mla.layout.kind = LayoutKind::kMla;
  mla.layout.latent_dim = 576;
  Namespace mla_heads = mla;
  mla_heads.layout.num_kv_heads = 0;
  mla_heads.layout.head_dim = 0;
  EXPECT_EQ(Chain(mla, tokens), Chain(mla_heads, tokens));
}

TEST(ChainFingerprintsTest, MultimodalInputChangesOnlyTheBlocksFromTheFirstItOverlaps) {
  const std::vector<uint32_t> tokens = Tokens(64);  // 4 blocks of 16
  const Namespace ns = Llama8b();
  const std::vector<Fingerprint> text_only = Chain(ns, tokens);
  ExtraKeys in_block_2;
  in_block_2.multimodal = {{.content_hash = "audio", .offset_tokens = 40, .length_tokens = 8}};
  const std::vector<Fingerprint> with_audio = Chain(ns, tokens, in_block_2);
  ASSERT_EQ(with_audio.size(), 4u);
  EXPECT_EQ(with_audio[0], text_only[0]);
  EXPECT_EQ(with_audio[1], text_only[1]);
  EXPECT_NE(with_audio[2], text_only[2]);
  EXPECT_NE(with_audio[3], text_only[3]);

  // Touching the last token of block 1 ([16, 32)) is an overlap; ending at token 32 is not.
  ExtraKeys ends_in_block_1;
  ends_in_block_1.multimodal = {{.content_hash = "image", .offset_tokens = 20, .length_tokens = 12}};
  EXPECT_NE(Chain(ns, tokens, ends_in_block_1)[1], text_only[1]);
  ExtraKeys starts_at_block_2;
  starts_at_block_2.multimodal = {{.content_hash = "image", .offset_tokens = 32, .length_tokens = 1}};
  EXPECT_EQ(Chain(ns, tokens, starts_at_block_2)[1], text_only[1]);
  EXPECT_NE(Chain(ns, tokens, starts_at_block_2)[2], text_only[2]);

  // An input past the last full block changes nothing.
  ExtraKeys past_the_end;
  past_the_end.multimodal = {{.content_hash = "image", .offset_tokens = 64, .length_tokens = 100}};
  EXPECT_EQ(Chain(ns, tokens, past_the_end), text_only);
}

TEST(ChainFingerprintsTest, TheOrderOfMultimodalInputsMatters) {
  const std::vector<uint32_t> tokens = Tokens(32);
  ExtraKeys ab;
  ab.multimodal = {{.content_hash = "a", .offset_tokens = 0, .length_tokens = 4},
                   {.content_hash = "b", .offset_tokens = 4, .length_tokens = 4}};
  ExtraKeys ba;
  ba.multimodal = {ab.multimodal[1], ab.multimodal[0]};
  EXPECT_NE(Chain(Llama8b(), tokens, ab)[0], Chain(Llama8b(), tokens, ba)[0]);
}

TEST(ChainFingerprintsTest, OnlyFullBlocksGetFingerprints) {
  const Namespace ns = Llama8b();
  const size_t b = ns.layout.block_tokens;
  const std::vector<std::pair<size_t, size_t>> cases = {{0, 0},     {1, 0},         {b - 1, 0}, {b, 1},
                                                        {b + 1, 1}, {2 * b - 1, 1}, {2 * b, 2}, {2 * b + 1, 2}};
  for (const auto& [num_tokens, want_blocks] : cases) {
    absl::StatusOr<std::vector<Fingerprint>> fps = ChainFingerprints(ns, Tokens(num_tokens));
    ASSERT_TRUE(fps.ok()) << fps.status();
    EXPECT_EQ(fps->size(), want_blocks) << num_tokens << " tokens";
  }
}

TEST(ChainFingerprintsTest, PartialLastBlockDoesNotAffectFullBlocks) {
  const Namespace ns = Llama8b();
  std::vector<uint32_t> tokens = Tokens(40);
  const std::vector<Fingerprint> a = Chain(ns, tokens);
  tokens[39] ^= 0xffff;
  EXPECT_EQ(Chain(ns, tokens), a);
}

TEST(ChainFingerprintsTest, FingerprintsOfAPrefixArePrefixOfTheFingerprints) {
  Namespace ns = Llama8b();
  ns.tenant_salt = "pepper";
  ExtraKeys extra;
  extra.lora = LoraKey{.adapter_id = "chat", .version = 7};
  extra.multimodal = {{.content_hash = "img", .offset_tokens = 20, .length_tokens = 30},
                      {.content_hash = "late", .offset_tokens = 150, .length_tokens = 10}};
  extra.cache_salt = "cs";
  const std::vector<uint32_t> tokens = Tokens(200);
  const std::vector<Fingerprint> full = Chain(ns, tokens, extra);
  ASSERT_EQ(full.size(), 12u);
  for (size_t n : {0, 1, 15, 16, 17, 47, 48, 100, 160, 199}) {
    const std::vector<uint32_t> prefix(tokens.begin(), tokens.begin() + n);
    const std::vector<Fingerprint> fps = Chain(ns, prefix, extra);
    ASSERT_EQ(fps.size(), n / 16) << n;
    EXPECT_TRUE(std::equal(fps.begin(), fps.end(), full.begin())) << n;
  }
}

TEST(ChainFingerprintsTest, EqualBlocksAtDifferentDepthsDiffer) {
  // The same 16 tokens repeated: each block's fingerprint covers its whole prefix.
  std::vector<uint32_t> tokens;
  for (int rep = 0; rep < 3; ++rep) {
    const std::vector<uint32_t> block = Tokens(16);
    tokens.insert(tokens.end(), block.begin(), block.end());
  }
  const std::vector<Fingerprint> fps = Chain(Llama8b(), tokens);
  ASSERT_EQ(fps.size(), 3u);
  EXPECT_NE(fps[0], fps[1]);
  EXPECT_NE(fps[1], fps[2]);
  EXPECT_NE(fps[0], fps[2]);
}

TEST(ChainFingerprintsTest, SameInputSameOutputAcrossCallsAndThreads) {
  const Namespace ns = Llama8b();
  const std::vector<uint32_t> tokens = Tokens(1000);
  const std::vector<Fingerprint> want = Chain(ns, tokens);
  EXPECT_EQ(Chain(ns, tokens), want);
  std::vector<std::vector<Fingerprint>> got(4);
  std::vector<std::thread> threads;
  for (size_t t = 0; t < got.size(); ++t) {
    threads.emplace_back([&, t] { got[t] = ChainFingerprints(ns, tokens).value(); });
  }
  for (std::thread& t : threads) t.join();
  for (const std::vector<Fingerprint>& g : got) EXPECT_EQ(g, want);
}

TEST(ChainFingerprintsTest, SameFingerprintsInAnotherProcess) {
  Namespace ns = Llama8b();
  ns.tenant_salt = "pepper";
  ExtraKeys extra;
  extra.lora = LoraKey{.adapter_id = "chat", .version = 7};
  const std::vector<uint32_t> tokens = Tokens(100);

  int pipe_fds[2];
  ASSERT_EQ(pipe(pipe_fds), 0);
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    // The child computes independently (nothing from the parent's chain is inherited: the parent
    // has not computed it yet) and exits without running the test framework's exit handlers.
    close(pipe_fds[0]);
    absl::StatusOr<std::vector<Fingerprint>> fps = ChainFingerprints(ns, tokens, extra);
    const std::string hex = fps.ok() ? HexList(*fps) : "error";
    size_t written = 0;
    while (written < hex.size()) {
      const ssize_t n = write(pipe_fds[1], hex.data() + written, hex.size() - written);
      if (n <= 0) _exit(2);
      written += static_cast<size_t>(n);
    }
    close(pipe_fds[1]);
    _exit(0);
  }
  close(pipe_fds[1]);
  std::string from_child;
  char buffer[4096];
  ssize_t n;
  while ((n = read(pipe_fds[0], buffer, sizeof(buffer))) > 0) {
    from_child.append(buffer, static_cast<size_t>(n));
  }
  close(pipe_fds[0]);
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;

  const std::vector<Fingerprint> fps = Chain(ns, tokens, extra);
  ASSERT_EQ(fps.size(), 6u);
  EXPECT_EQ(from_child, HexList(fps));
}

// --- Validation -----------------------------------------------------------------------------------------

TEST(ChainFingerprintsTest, RejectsAnInvalidNamespace) {
  Namespace ns = Llama8b();
  ns.tenant = "";
  absl::StatusOr<std::vector<Fingerprint>> fps = ChainFingerprints(ns, Tokens(32));
  EXPECT_EQ(fps.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(fps.status().message().find("namespace.tenant"), std::string::npos) << fps.status();

  ns = Llama8b();
  ns.layout.head_dim = 0;
  fps = ChainFingerprints(ns, Tokens(32));
  EXPECT_EQ(fps.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(fps.status().message().find("layout.head_dim"), std::string::npos) << fps.status();
}

TEST(ChainFingerprintsTest, RejectsExtraKeysOutOfRangeAndNamesThem) {
  const std::vector<std::pair<std::string, std::function<void(ExtraKeys&)>>> cases = {
      {"extra.lora.adapter_id", [](ExtraKeys& e) { e.lora = LoraKey{.adapter_id = "", .version = 1}; }},
      {"extra.lora.adapter_id", [](ExtraKeys& e) { e.lora = LoraKey{.adapter_id = std::string(256, 'x')}; }},
      {"extra.multimodal[1].content_hash",
       [](ExtraKeys& e) {
         e.multimodal = {{.content_hash = "ok", .offset_tokens = 0, .length_tokens = 1},
                         {.content_hash = "", .offset_tokens = 0, .length_tokens = 1}};
       }},
      {"extra.multimodal[0].content_hash",
       [](ExtraKeys& e) { e.multimodal = {{.content_hash = std::string(256, 'h'), .length_tokens = 1}}; }},
      {"extra.multimodal[0].length_tokens",
       [](ExtraKeys& e) { e.multimodal = {{.content_hash = "h", .offset_tokens = 3, .length_tokens = 0}}; }},
      {"extra.multimodal[0]",
       [](ExtraKeys& e) {
         e.multimodal = {{.content_hash = "h", .offset_tokens = 0xfffffff0u, .length_tokens = 0x20}};
       }},
  };
  for (const auto& [field, mutate] : cases) {
    ExtraKeys extra;
    mutate(extra);
    absl::StatusOr<std::vector<Fingerprint>> fps = ChainFingerprints(Llama8b(), Tokens(32), extra);
    EXPECT_EQ(fps.status().code(), absl::StatusCode::kInvalidArgument) << field;
    EXPECT_NE(fps.status().message().find(field), std::string::npos) << fps.status();
  }
  // The limits themselves are accepted: 255 bytes, and an input ending exactly at 2^32.
  ExtraKeys at_limits;
  at_limits.lora = LoraKey{.adapter_id = std::string(255, 'x')};
  at_limits.multimodal = {{.content_hash = std::string(255, 'h'), .offset_tokens = 0xfffffff0u, .length_tokens = 0x10}};
  EXPECT_TRUE(ChainFingerprints(Llama8b(), Tokens(32), at_limits).ok());
}

TEST(NamespaceTest, ValidateNamesTheBadField) {
  EXPECT_TRUE(Llama8b().Validate().ok());
  const std::vector<std::pair<std::string, std::function<void(Namespace&)>>> cases = {
      {"namespace.tenant", [](Namespace& ns) { ns.tenant = ""; }},
      {"namespace.tenant", [](Namespace& ns) { ns.tenant = std::string(256, 't'); }},
      {"namespace.model", [](Namespace& ns) { ns.model = ""; }},
      {"namespace.model", [](Namespace& ns) { ns.model = std::string(256, 'm'); }},
      {"namespace.revision", [](Namespace& ns) { ns.revision = std::string(256, 'r'); }},
      {"namespace.tenant_salt", [](Namespace& ns) { ns.tenant_salt = std::string(256, 's'); }},
      {"layout.num_layers", [](Namespace& ns) { ns.layout.num_layers = 0; }},
  };
  for (const auto& [field, mutate] : cases) {
    Namespace ns = Llama8b();
    mutate(ns);
    const absl::Status status = ns.Validate();
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << field;
    EXPECT_NE(status.message().find(field), std::string::npos) << status;
  }
  Namespace at_limits = Llama8b();
  at_limits.tenant = std::string(255, 't');
  at_limits.model = std::string(255, 'm');
  at_limits.revision = "";
  at_limits.tenant_salt = std::string(255, 's');
  EXPECT_TRUE(at_limits.Validate().ok());
}

TEST(NamespaceTest, CanonicalBytesFollowTheDocumentedLayout) {
  Namespace ns;
  ns.tenant = "t";
  ns.model = "m";
  ns.layout = {.kind = LayoutKind::kStandard,
               .dtype = DType::kBf16,
               .codec = Codec::kInt8,
               .num_layers = 2,
               .num_kv_heads = 4,
               .head_dim = 64,
               .latent_dim = 9,
               .block_tokens = 16,
               .tp_size = 2,
               .quant_group_size = 32};
  // clang-format off
  const std::string kHead = "01"  // scheme version
                            "01";  // SHA-256
  const std::string kTenant = "01000000" "74";  // str("t")
  const std::string kModel = "01000000" "6d";   // str("m")
  const std::string kLayout = "01" "02" "02"    // standard, bf16, int8
                              "02000000"        // num_layers
                              "04000000"        // num_kv_heads
                              "40000000"        // head_dim
                              "00000000"        // latent_dim: unused by standard attention, so 0
                              "10000000"        // block_tokens
                              "02000000"        // tp_size
                              "20000000";       // quant_group_size
  EXPECT_EQ(Hex(ns.CanonicalBytes()), kHead + kTenant + kModel + "00" + kLayout);
  ns.revision = "";
  EXPECT_EQ(Hex(ns.CanonicalBytes()), kHead + kTenant + kModel + "01" "00000000" + kLayout);
  ns.revision = "r";
  EXPECT_EQ(Hex(ns.CanonicalBytes()), kHead + kTenant + kModel + "01" "01000000" "72" + kLayout);
  // clang-format on
}

TEST(NamespaceTest, IdIsStableAndSeparatesNamespaces) {
  const Namespace a = Llama8b();
  EXPECT_EQ(a.Id(), Llama8b().Id());
  Namespace b = a;
  b.model = "other";
  EXPECT_NE(a.Id(), b.Id());
  Namespace salted = a;
  salted.tenant_salt = "secret";
  EXPECT_EQ(a.Id(), salted.Id());  // the salt never leaves the client, so it is not in the id
}

// --- Fingerprint --------------------------------------------------------------------------------------

TEST(FingerprintTest, HexRoundTrips) {
  for (const Fingerprint& fp : Chain(Llama8b(), Tokens(64))) {
    const std::string hex = fp.Hex();
    ASSERT_EQ(hex.size(), 64u);
    EXPECT_EQ(hex.find_first_not_of("0123456789abcdef"), std::string::npos) << hex;
    absl::StatusOr<Fingerprint> back = Fingerprint::FromHex(hex);
    ASSERT_TRUE(back.ok()) << back.status();
    EXPECT_EQ(*back, fp);
  }
}

TEST(FingerprintTest, FromHexAcceptsEitherCase) {
  const std::string lower = "00112233445566778899aabbccddeeff0123456789abcdeffedcba9876543210";
  std::string upper = lower;
  for (char& c : upper) c = static_cast<char>(std::toupper(c));
  absl::StatusOr<Fingerprint> a = Fingerprint::FromHex(lower);
  absl::StatusOr<Fingerprint> b = Fingerprint::FromHex(upper);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(*a, *b);
  EXPECT_EQ(a->bytes[0], 0x00);
  EXPECT_EQ(a->bytes[1], 0x11);
  EXPECT_EQ(a->bytes[31], 0x10);
  EXPECT_EQ(b->Hex(), lower);
}

TEST(FingerprintTest, FromHexRejectsBadInput) {
  const std::string good(64, 'a');
  for (const std::string& bad :
       {std::string(), std::string(63, 'a'), std::string(65, 'a'), good.substr(0, 62) + "g0", good.substr(0, 63) + " ",
        "0x" + good.substr(2), good.substr(0, 10) + "-" + good.substr(11)}) {
    absl::StatusOr<Fingerprint> fp = Fingerprint::FromHex(bad);
    EXPECT_EQ(fp.status().code(), absl::StatusCode::kInvalidArgument) << "\"" << bad << "\"";
  }
}

TEST(FingerprintTest, RingPositionIsTheFirstEightBytesLittleEndian) {
  Fingerprint fp;
  fp.bytes[0] = 0x01;
  EXPECT_EQ(fp.RingPosition(), 1u);
  fp.bytes[7] = 0x80;
  EXPECT_EQ(fp.RingPosition(), 0x8000000000000001ULL);
  fp.bytes[8] = 0xff;  // beyond the first 8 bytes: ignored
  EXPECT_EQ(fp.RingPosition(), 0x8000000000000001ULL);
  EXPECT_EQ(AtRingPosition(0x0123456789abcdefULL).RingPosition(), 0x0123456789abcdefULL);
}

TEST(FingerprintTest, OrdersAndHashesAsBytes) {
  Fingerprint a, b;
  b.bytes[31] = 1;
  EXPECT_LT(a, b);
  EXPECT_NE(a, b);
  EXPECT_EQ(a, Fingerprint{});
  EXPECT_EQ(absl::Hash<Fingerprint>{}(a), absl::Hash<Fingerprint>{}(Fingerprint{}));
  EXPECT_NE(absl::Hash<Fingerprint>{}(a), absl::Hash<Fingerprint>{}(b));
}

TEST(BlockKeyTest, ShardsOfOneFingerprintAreDistinctKeys) {
  const std::vector<Fingerprint> fps = Chain(Llama8b(), Tokens(32));
  ASSERT_EQ(fps.size(), 2u);
  absl::flat_hash_set<BlockKey> keys;
  for (const Fingerprint& fp : fps) {
    for (uint32_t shard = 0; shard < 4; ++shard) keys.insert({.fingerprint = fp, .shard = shard});
  }
  EXPECT_EQ(keys.size(), 8u);
  EXPECT_TRUE(keys.contains(BlockKey{.fingerprint = fps[1], .shard = 3}));
  EXPECT_FALSE(keys.contains(BlockKey{.fingerprint = fps[1], .shard = 4}));
}

}  // namespace
}  // namespace kvtier
