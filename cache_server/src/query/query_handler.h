// QueryHandler: the index query endpoints of kvtier-server, POST /query and POST /query_by_hash
// (docs/query.md): how long a prefix of a prompt this server holds, per tier, and the tier of each block.
#ifndef KVTIER_SERVER_SRC_QUERY_QUERY_HANDLER_H_
#define KVTIER_SERVER_SRC_QUERY_QUERY_HANDLER_H_

#include <optional>
#include <string>
#include <string_view>

namespace kvtier::server {

class Authenticator;
class BlockStore;
class EngineHashIndex;

// An HTTP answer: status code and a JSON body.
struct HttpReply {
  int status = 200;
  std::string body;  // JSON; an error is {"error": "..."}
};

// Answers the query endpoints from the store's committed blocks. Asking reads each block with
// BlockStore::Inspect: it takes no lease, is not an access and changes no counter, so querying changes
// nothing the server reports. Needs an admin token when tokens are configured (401 without a valid
// token, 403 with a worker's), as the admin RPCs do.
// Thread-safety: Handle() may be called concurrently (civetweb's worker threads).
class QueryHandler {
 public:
  // `store`, `index` and `auth` are not owned and must outlive the handler.
  QueryHandler(BlockStore& store, const EngineHashIndex& index, const Authenticator& auth, std::string node_id)
      : store_(store), index_(index), auth_(auth), node_id_(std::move(node_id)) {}

  // Whether `path` is one of the endpoints this handler serves ("/query", "/query_by_hash").
  static bool Serves(std::string_view path);

  // Answers one request. `authorization` is the Authorization header (null when absent); `body` is
  // borrowed for the call. Statuses: 200, 400 (bad JSON or fields; the body names the field), 401, 403,
  // 404 (another path), 405 (not POST).
  HttpReply Handle(std::string_view method, std::string_view path, const std::string* authorization,
                   std::string_view body) const;

 private:
  HttpReply QueryTokens(std::string_view body) const;
  HttpReply QueryHashes(std::string_view body) const;

  BlockStore& store_;
  const EngineHashIndex& index_;
  const Authenticator& auth_;
  const std::string node_id_;
};

}  // namespace kvtier::server

#endif  // KVTIER_SERVER_SRC_QUERY_QUERY_HANDLER_H_
