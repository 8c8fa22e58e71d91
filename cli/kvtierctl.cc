// kvtierctl: the kvtier admin CLI (docs/kvtierctl.md).
//   kvtierctl --members [node_id=]host:port,... status | stats | groups | ls | inspect | lookup | query | evict |
//   drain | verify [--json]
// main() is the only code that reads argv, files named by flags, or the environment (KVTIER_MEMBERS,
// KVTIER_TENANT_SALT); the commands (commands.h) take option structs. Every member is asked in parallel
// under one deadline, so a dead member costs at most --timeout-ms, and the report is printed with
// whatever answered (exit code 3 says something did not).
#include <unistd.h>

#include <cmath>
#include <cstdint>
#include <fstream>
#include <iostream>
#include <limits>
#include <optional>
#include <span>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "commands.h"
#include "kvtier/client/dns_resolver.h"
#include "kvtier/common/host_port.h"
#include "namespace_flags.h"
#include "replayer.h"

namespace kvtier::cli {
namespace {

constexpr const char* kFooter =
    "Members come from --members or, when it is absent, from the environment variable KVTIER_MEMBERS\n"
    "(the same comma-separated host:port list), plus the addresses --members-dns names resolve to.\n"
    "A member given as node_id=host:port keeps its place on the ring when it does not answer.\n"
    "\n"
    "Exit codes (when several apply, the highest):\n"
    "  0  done; every member asked answered (status: and reports SERVING)\n"
    "  1  other failure (e.g. two members report the same node id; inspect: no member holds the block)\n"
    "  2  usage error (bad flag or argument, or a file a flag names cannot be read)\n"
    "  3  some member is unreachable, failed, or is not SERVING; the report is still printed\n"
    "  4  verify found corrupt blocks\n"
    "\n"
    "See docs/kvtierctl.md.";

// CLI::Range for seconds, which also rejects "nan" (every comparison with NaN is false, so Range
// alone lets it through).
CLI::Validator SecondsRange(double min, double max) {
  return CLI::Validator(
      [min, max](std::string& text) -> std::string {
        double v = 0;
        if (!absl::SimpleAtod(text, &v) || !std::isfinite(v) || v < min || v > max) {
          return absl::StrCat("\"", text, "\" is not a number of seconds in [", min, " - ", max, "]");
        }
        return "";
      },
      absl::StrCat("SECONDS in [", min, " - ", max, "]"));
}

// The longest prompt lookup takes (--tokens-file, or --trace-line's hash_ids x --block-tokens): 16 Mi
// tokens, 64 MiB of token ids, far above any model's context.
constexpr uint64_t kMaxPromptTokens = uint64_t{16} << 20;

// One --members entry: "host:port" or "node_id=host:port" (as ClientOptions::members), blanks around
// it ignored. Returns {node_id or "", address}. Errors: InvalidArgument naming the entry.
absl::StatusOr<std::pair<std::string, std::string>> ParseMember(absl::string_view entry) {
  const absl::string_view m = absl::StripAsciiWhitespace(entry);
  const size_t eq = m.find('=');
  const absl::string_view address = eq == absl::string_view::npos ? m : m.substr(eq + 1);
  if (eq == 0) return absl::InvalidArgumentError(absl::StrCat("\"", m, "\" has an empty node id before '='"));
  if (auto hp = kvtier::ParseHostPort(address); !hp.ok()) return hp.status();
  return std::pair<std::string, std::string>(eq == absl::string_view::npos ? "" : std::string(m.substr(0, eq)),
                                             std::string(address));
}

int UsageError(const std::string& message) {
  std::cerr << message << "\nRun with --help for more information.\n";
  return kExitUsage;
}

// Whitespace-separated uint32 token ids from `path` ("-" = stdin).
absl::StatusOr<std::vector<uint32_t>> ReadTokens(const std::string& path) {
  std::stringstream text;
  if (path == "-") {
    text << std::cin.rdbuf();
  } else {
    std::ifstream in(path);
    if (!in) return absl::NotFoundError(absl::StrCat("--tokens-file: ", path, " cannot be read"));
    text << in.rdbuf();
  }
  std::vector<uint32_t> tokens;
  std::string word;
  size_t n = 0;
  while (text >> word) {
    ++n;
    if (n > kMaxPromptTokens) {
      return absl::InvalidArgumentError(
          absl::StrCat("--tokens-file: more than ", kMaxPromptTokens, " tokens, the longest prompt lookup takes"));
    }
    uint32_t t = 0;
    if (!absl::SimpleAtoi(word, &t)) {
      return absl::InvalidArgumentError(
          absl::StrCat("--tokens-file: word ", n, " (\"", word, "\") is not a uint32 token id"));
    }
    tokens.push_back(t);
  }
  return tokens;
}

// The prompt of one Mooncake trace line, made the way bench/trace_replay makes it: block_tokens tokens
// per hash id from BlockTokens(hash_id).
absl::StatusOr<std::vector<uint32_t>> TraceLineTokens(const std::string& line, uint32_t block_tokens,
                                                      std::optional<uint32_t>* input_length) {
  const nlohmann::json j = nlohmann::json::parse(line, nullptr, false);
  if (j.is_discarded() || !j.is_object()) return absl::InvalidArgumentError("--trace-line: not a JSON object");
  if (!j.contains("hash_ids") || !j["hash_ids"].is_array()) {
    return absl::InvalidArgumentError("--trace-line: no \"hash_ids\" array");
  }
  if (j.contains("input_length") && !j["input_length"].is_null()) {
    const nlohmann::json& n = j["input_length"];
    if (!n.is_number_unsigned() || n.get<uint64_t>() > std::numeric_limits<uint32_t>::max()) {
      return absl::InvalidArgumentError(
          absl::StrCat("--trace-line: \"input_length\" is ", n.dump(), ", not an integer in [0, 4294967295]"));
    }
    *input_length = n.get<uint32_t>();
  }
  // hash_ids x block_tokens tokens are made; both come from the user, so bound the product first.
  const uint64_t num_ids = j["hash_ids"].size();
  if (block_tokens > 0 && num_ids > kMaxPromptTokens / block_tokens) {
    return absl::InvalidArgumentError(absl::StrCat("--trace-line: ", num_ids, " hash_ids of ", block_tokens,
                                                   " tokens (--block-tokens) are more than ", kMaxPromptTokens,
                                                   " tokens, the longest prompt lookup takes"));
  }
  std::vector<uint32_t> tokens(num_ids * block_tokens);
  for (size_t i = 0; i < j["hash_ids"].size(); ++i) {
    const nlohmann::json& id = j["hash_ids"][i];
    if (!id.is_number_unsigned()) {
      return absl::InvalidArgumentError(absl::StrCat("--trace-line: hash_ids[", i, "] is not a non-negative integer"));
    }
    bench::BlockTokens(id.get<uint64_t>(), std::span(tokens).subspan(i * block_tokens, block_tokens));
  }
  return tokens;
}

// --tenant / --namespace-id / --tier, shared by ls and evict.
struct FilterFlags {
  std::string tenant;
  std::string namespace_id;
  std::string tier;
  CLI::Option* tenant_opt = nullptr;
  CLI::Option* namespace_opt = nullptr;
  CLI::Option* tier_opt = nullptr;

  void Register(CLI::App* app) {
    tenant_opt = app->add_option("--tenant", tenant, "Only blocks of this tenant");
    namespace_opt = app->add_option("--namespace-id", namespace_id,
                                    "Only blocks of this namespace (its id: decimal or 0x hex, as ls and lookup show)");
    tier_opt = app->add_option("--tier", tier, "Only blocks in this tier")->check(CLI::IsMember({"host", "disk"}));
  }
  absl::StatusOr<FilterOptions> Build() const {
    FilterOptions f{.tenant = tenant, .tier = tier};
    if (!namespace_id.empty()) {
      auto id = ParseNamespaceId(namespace_id);
      if (!id.ok()) return absl::InvalidArgumentError(absl::StrCat("--namespace-id: ", id.status().message()));
      f.namespace_id = *id;
    }
    return f;
  }
};

}  // namespace
}  // namespace kvtier::cli

int main(int argc, char** argv) {
  using namespace kvtier::cli;
  CLI::App app{"kvtierctl: inspect and operate a kvtier cluster."};
  app.footer(kFooter);
  app.require_subcommand(1);
  app.fallthrough();  // global options may also follow the subcommand: `kvtierctl status --json`

  // Each --members (or $KVTIER_MEMBERS) is kept whole and split at commas below, so that an empty list
  // such as ",,," is reported as such instead of making CLI11 take the next word as a member.
  std::vector<std::string> member_lists;
  app.add_option("--members", member_lists,
                 "Comma-separated host:port (or node_id=host:port) of every member (gRPC address)")
      ->expected(1)
      ->allow_extra_args(false)  // one list per --members: a stray word is an error, not a member
      ->take_all()               // --members may be repeated; the lists are joined
      ->envname("KVTIER_MEMBERS")
      ->type_name("[ID=]HOST:PORT,...")
      ->check([](const std::string& list) -> std::string {
        for (absl::string_view m : absl::StrSplit(list, ',', absl::SkipWhitespace())) {
          if (absl::Status s = ParseMember(m).status(); !s.ok()) return std::string(s.message());
        }
        return "";
      });
  std::vector<std::string> members_dns;
  app.add_option("--members-dns", members_dns,
                 "NAME:PORT whose DNS records are members too (a headless Service); may be repeated")
      ->type_name("NAME:PORT");
  std::string dns_server;
  app.add_option("--dns-server", dns_server,
                 "DNS server(s) for --members-dns: IP, IP:PORT or [IPv6]:PORT, comma-separated (any port); "
                 "default: the system resolver")
      ->type_name("IP[:PORT]");
  int64_t timeout_ms = 2000;
  app.add_option("--timeout-ms", timeout_ms, "Deadline of each RPC, in milliseconds")
      ->check(CLI::Range(int64_t{1}, int64_t{600000}))
      ->capture_default_str();
  bool json = false;
  app.add_flag("--json", json, "Print one JSON object instead of tables");
  kvtier::wire::ChannelSecurity security;
  app.add_option("--tls-ca-file", security.ca_file,
                 "PEM CA of the servers' certificates: talk TLS (default: plaintext)")
      ->envname("KVTIER_TLS_CA_FILE")
      ->type_name("FILE");
  app.add_option("--tls-cert-file", security.cert_file, "PEM client certificate for mutual TLS (with --tls-key-file)")
      ->envname("KVTIER_TLS_CERT_FILE")
      ->type_name("FILE");
  app.add_option("--tls-key-file", security.key_file, "PEM key of --tls-cert-file")
      ->envname("KVTIER_TLS_KEY_FILE")
      ->type_name("FILE");
  app.add_option("--tls-server-name", security.server_name,
                 "Name the servers' certificates carry, when not the host of --members")
      ->type_name("NAME");
  app.add_option("--token", security.auth_token, "Bearer token (an admin token for most commands)")
      ->envname("KVTIER_TOKEN")
      ->type_name("TOKEN");
  uint32_t virtual_nodes = kvtier::HashRing::kDefaultVirtualNodes;
  app.add_option("--virtual-nodes", virtual_nodes, "Ring points per member; must match the clients' setting")
      ->check(CLI::Range(1u, 1u << 20))
      ->capture_default_str();

  // status, stats
  CLI::App* status = app.add_subcommand(
      "status", "Health, node id, ring share, usage per tier, mode, policy, transport and uptime of each member");
  CLI::App* stats = app.add_subcommand(
      "stats", "Lookup, read, write, eviction, rejection and lease counters of each member, with cluster totals");
  double interval_s = 0;
  stats
      ->add_option("--interval-s", interval_s,
                   "Take two snapshots this many seconds apart and also print per-second rates")
      ->check(SecondsRange(0.001, 86400.0));
  bool stats_counters = false;
  stats->add_flag("--counters", stats_counters,
                  "Also print every counter the servers list (the samples /metrics serves), per member and summed");

  // groups
  CLI::App* groups = app.add_subcommand(
      "groups", "Similarity groups with the most lookup traffic, merged across members, with their hit ratios");
  GroupsOptions groups_options;
  groups->add_option("--limit", groups_options.limit, "Groups shown (0 = all)")->capture_default_str();

  // ls
  CLI::App* ls =
      app.add_subcommand("ls", "Blocks of the members (or of --node), by namespace, tenant or tier, in pages");
  FilterFlags ls_filter;
  ls_filter.Register(ls);
  LsOptions ls_options;
  ls->add_option("--node", ls_options.nodes, "Only this member (node id or address); may be repeated");
  ls->add_option("--limit", ls_options.limit, "Blocks per page; 0 = every page")->capture_default_str();
  ls->add_option("--cursor", ls_options.cursor, "Continue from the next_cursor of the previous page");

  // inspect
  CLI::App* inspect =
      app.add_subcommand("inspect", "One block: its owner by the ring and what every member holding it reports");
  InspectOptions inspect_options;
  inspect->add_option("fingerprint", inspect_options.fingerprint_hex, "The block's fingerprint (64 hex digits)")
      ->required();
  inspect->add_option("--shard", inspect_options.shard, "TP shard")->capture_default_str();

  // lookup
  CLI::App* lookup =
      app.add_subcommand("lookup", "How many leading blocks of a prompt the cluster holds, on which nodes and tiers");
  NamespaceFlags lookup_ns;
  lookup_ns.Register(lookup, /*with_salt=*/true);
  std::string tokens_file, trace_line;
  bool per_block = false;
  auto* tokens_opt = lookup->add_option("--tokens-file", tokens_file,
                                        "The prompt: whitespace-separated uint32 token ids ('-' = stdin)");
  auto* trace_opt = lookup->add_option(
      "--trace-line", trace_line,
      "The prompt of one Mooncake trace request (JSON with hash_ids), made as bench/trace_replay makes it");
  tokens_opt->excludes(trace_opt);
  lookup->add_flag("--per-block", per_block, "Also print one row per block");

  // query
  CLI::App* query = app.add_subcommand(
      "query", "Ask every member's index query endpoint about a prompt (token ids or engine block hashes); merge them");
  NamespaceFlags query_ns;
  query_ns.Register(query, /*with_salt=*/true);
  QueryOptions query_options;
  std::string query_tokens_file;
  auto* qtokens_opt = query->add_option("--tokens-file", query_tokens_file,
                                        "The prompt: whitespace-separated uint32 token ids ('-' = stdin)");
  std::string query_trace_line;
  auto* qtrace_opt = query->add_option("--trace-line", query_trace_line,
                                       "The prompt of one Mooncake trace request, as lookup --trace-line takes it");
  qtokens_opt->excludes(qtrace_opt);
  auto* qhash_opt = query
                        ->add_option("--block-hashes", query_options.block_hashes,
                                     "Engine block hashes of the prompt, in order (decimal integers or hex bytes)")
                        ->delimiter(',');
  qtokens_opt->excludes(qhash_opt);
  qtrace_opt->excludes(qhash_opt);
  query->add_option("--block-size", query_options.block_size, "With --block-hashes: tokens per block (default 16)");
  query->add_option("--hash-tp-size", query_options.tp_size, "With --block-hashes: shards per block (default 1)");

  // evict
  CLI::App* evict = app.add_subcommand("evict", "Drop one block, or the blocks of a tenant, a namespace or a tier");
  EvictOptions evict_options;
  FilterFlags evict_filter;
  evict_filter.Register(evict);
  auto* fp_opt = evict->add_option("--fingerprint", evict_options.fingerprint_hex, "This block only (64 hex digits)");
  auto* shard_opt = evict->add_option("--shard", evict_options.shard, "TP shard of --fingerprint (default 0)");
  auto* all_opt = evict->add_flag("--all", evict_options.all, "Every block (needed when no filter is given)");
  evict->add_option("--node", evict_options.nodes, "Only on this member (node id or address); may be repeated");
  fp_opt->excludes(evict_filter.tenant_opt)
      ->excludes(evict_filter.namespace_opt)
      ->excludes(evict_filter.tier_opt)
      ->excludes(all_opt);
  all_opt->excludes(evict_filter.tenant_opt)->excludes(evict_filter.namespace_opt)->excludes(evict_filter.tier_opt);
  shard_opt->needs(fp_opt);

  // drain
  CLI::App* drain = app.add_subcommand(
      "drain", "Stop a member taking new blocks and hand its hottest blocks to their owners on the ring without it");
  DrainOptions drain_options;
  NamespaceFlags drain_ns;
  std::string namespaces_file;
  drain->add_option("node", drain_options.node, "The member to drain: node id or address")->required();
  drain->add_flag("--undo", drain_options.undo, "Take new blocks again (nothing is handed off)");
  drain->add_option("--hand-off", drain_options.hand_off, "Hand off at most this many blocks, hottest first; 0 = none")
      ->capture_default_str();
  drain->add_option("--namespaces-file", namespaces_file,
                    "JSON namespace (or array of them) whose blocks may be handed off; see docs/kvtierctl.md");
  drain_ns.Register(drain, /*with_salt=*/false);

  // verify
  CLI::App* verify = app.add_subcommand("verify", "Checksum scrub of every block of the members (or of --node)");
  VerifyOptions verify_options;
  double deadline_s = 3600;
  bool no_progress = false;
  verify->add_option("--node", verify_options.nodes, "Only this member (node id or address); may be repeated");
  verify->add_option("--deadline-s", deadline_s, "Give up on a member's scrub after this many seconds")
      ->check(SecondsRange(0.001, 7 * 86400.0))
      ->capture_default_str();
  verify->add_flag("--no-progress", no_progress, "No progress on stderr");

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    // "kvtierctl --members X bogus": CLI11 leaves "bogus" unparsed and reports only that no subcommand
    // was given; name the word instead.
    if (dynamic_cast<const CLI::RequiredError*>(&e) != nullptr && app.get_subcommands().empty()) {
      const std::vector<std::string> rest = app.remaining();
      if (!rest.empty() && !rest[0].empty() && rest[0][0] != '-') {
        return UsageError(
            absl::StrCat("unknown subcommand \"", rest[0],
                         "\" (status, stats, groups, ls, inspect, lookup, query, evict, drain or verify)"));
      }
    }
    return app.exit(e) == 0 ? kExitOk : kExitUsage;  // --help exits 0
  }

  CtlOptions options;
  absl::flat_hash_set<std::string> seen;
  for (const std::string& list : member_lists) {
    // "a:1,,b:2" and a trailing comma are tolerated.
    for (absl::string_view m : absl::StrSplit(list, ',', absl::SkipWhitespace())) {
      auto member = ParseMember(m);
      if (!member.ok()) return UsageError(absl::StrCat("--members: ", member.status().message()));
      const auto& [node_id, address] = *member;
      if (!seen.insert(address).second) return UsageError(absl::StrCat("--members: ", address, " is given twice"));
      options.members.push_back(address);
      if (!node_id.empty()) options.node_ids[address] = node_id;
    }
  }
  if (absl::Status s = kvtier::client::ValidateDnsServer(dns_server); !s.ok()) {
    return UsageError(absl::StrCat("--dns-server: ", s.message()));
  }
  for (const std::string& name : members_dns) {
    auto resolved = ResolveMembers(name, dns_server, absl::Milliseconds(timeout_ms));
    if (!resolved.ok()) {
      if (resolved.status().code() == absl::StatusCode::kInvalidArgument) {
        return UsageError(absl::StrCat("--members-dns: ", resolved.status().message()));
      }
      std::cerr << "kvtierctl: --members-dns: " << resolved.status().message() << "\n";
      continue;
    }
    for (std::string& address : *resolved) {
      if (seen.insert(address).second) options.members.push_back(std::move(address));
    }
  }
  if (options.members.empty()) {
    if (!members_dns.empty()) {
      std::cerr << "kvtierctl: no member: --members-dns resolved to nothing\n";
      return kExitUnreachable;
    }
    if (!member_lists.empty()) {
      return UsageError(absl::StrCat("--members: empty member list (\"", absl::StrJoin(member_lists, ","), "\")"));
    }
    return UsageError("--members: no member given (--members, --members-dns or $KVTIER_MEMBERS)");
  }
  options.rpc_timeout = absl::Milliseconds(timeout_ms);
  options.json = json;
  {
    auto credentials = kvtier::wire::MakeChannelCredentials(security, "--tls-");
    // Bad TLS flags, and a --tls-*-file that cannot be read or holds no PEM block, are usage errors, as
    // for every file a flag names (--tokens-file, --namespaces-file).
    if (!credentials.ok()) return UsageError(std::string(credentials.status().message()));
    options.credentials = *std::move(credentials);
    options.security = security;
  }
  options.virtual_nodes = virtual_nodes;

  try {
    if (status->parsed()) return RunStatus(options);
    if (stats->parsed()) return RunStats(options, {.interval = absl::Seconds(interval_s), .counters = stats_counters});
    if (groups->parsed()) return RunGroups(options, groups_options);
    if (ls->parsed()) {
      auto f = ls_filter.Build();
      if (!f.ok()) return UsageError(std::string(f.status().message()));
      ls_options.filter = *f;
      return RunLs(options, ls_options);
    }
    if (inspect->parsed()) return RunInspect(options, inspect_options);
    if (lookup->parsed()) {
      if (tokens_opt->count() == 0 && trace_opt->count() == 0) {
        return UsageError("lookup: give the prompt with --tokens-file or --trace-line");
      }
      auto ns = lookup_ns.Build();
      if (!ns.ok()) return UsageError(std::string(ns.status().message()));
      LookupOptions lo{.ns = *ns, .per_block = per_block};
      auto tokens = tokens_opt->count() > 0 ? ReadTokens(tokens_file)
                                            : TraceLineTokens(trace_line, ns->layout.block_tokens, &lo.input_length);
      if (!tokens.ok()) return UsageError(std::string(tokens.status().message()));
      lo.tokens = *std::move(tokens);
      return RunLookup(options, lo);
    }
    if (query->parsed()) {
      if (qtokens_opt->count() == 0 && qtrace_opt->count() == 0 && qhash_opt->count() == 0) {
        return UsageError("query: give the prompt with --tokens-file, --trace-line or --block-hashes");
      }
      if (qhash_opt->count() == 0) {
        auto ns = query_ns.Build();
        if (!ns.ok()) return UsageError(std::string(ns.status().message()));
        query_options.ns = *ns;
        auto tokens = qtokens_opt->count() > 0
                          ? ReadTokens(query_tokens_file)
                          : TraceLineTokens(query_trace_line, ns->layout.block_tokens, &query_options.input_length);
        if (!tokens.ok()) return UsageError(std::string(tokens.status().message()));
        query_options.tokens = *std::move(tokens);
      }
      return RunQuery(options, query_options);
    }
    if (evict->parsed()) {
      auto f = evict_filter.Build();
      if (!f.ok()) return UsageError(std::string(f.status().message()));
      evict_options.filter = *f;
      if (evict_options.fingerprint_hex.empty() && !evict_options.all && evict_options.filter.empty()) {
        return UsageError("evict: give --fingerprint, a filter (--tenant, --namespace-id, --tier) or --all");
      }
      return RunEvict(options, evict_options);
    }
    if (drain->parsed()) {
      if (!namespaces_file.empty()) {
        auto loaded = LoadNamespacesFile(namespaces_file);
        if (!loaded.ok()) return UsageError(absl::StrCat("--namespaces-file: ", loaded.status().message()));
        drain_options.namespaces = *std::move(loaded);
      }
      if (drain_ns.Given()) {
        auto ns = drain_ns.Build();
        if (!ns.ok()) return UsageError(std::string(ns.status().message()));
        drain_options.namespaces.push_back(*std::move(ns));
      }
      return RunDrain(options, drain_options);
    }
    verify_options.deadline = absl::Seconds(deadline_s);
    verify_options.progress = !no_progress && !(json && isatty(STDERR_FILENO) != 1);
    return RunVerify(options, verify_options);
  } catch (const std::exception& e) {  // e.g. std::bad_alloc; nothing of ours throws
    std::cerr << "kvtierctl: " << e.what() << "\n";
    return kExitFailure;
  }
}
