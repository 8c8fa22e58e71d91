// Serves QueryHandler's endpoints on the /metrics listener: prometheus-cpp's Exposer runs civetweb and
// takes civetweb callbacks; its begin_request callback answers /query and /query_by_hash before
// civetweb routes the request, and leaves every other path (/metrics) to the Exposer (docs/query.md).
#ifndef KVTIER_SERVER_SRC_QUERY_QUERY_HTTP_H_
#define KVTIER_SERVER_SRC_QUERY_QUERY_HTTP_H_

struct CivetCallbacks;

namespace kvtier::server {

class QueryHandler;

// The callbacks to construct a prometheus::Exposer with. Static storage; the Exposer copies them.
const CivetCallbacks* QueryHttpCallbacks();

// Routes query requests that arrive on listening port `port` to `handler` (not owned) until
// UnregisterQueryHttp(port). One process may hold several servers (tests), told apart by their ports.
// Register after the Exposer bound its port (requests before that get civetweb's 404); unregister after
// the Exposer was destroyed (its threads joined), so that no request is still in `handler`.
// Thread-safety: a process-wide map under a mutex.
void RegisterQueryHttp(int port, const QueryHandler* handler);
void UnregisterQueryHttp(int port);

}  // namespace kvtier::server

#endif  // KVTIER_SERVER_SRC_QUERY_QUERY_HTTP_H_
