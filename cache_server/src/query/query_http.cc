#include "query/query_http.h"

#include <CivetServer.h>
#include <civetweb.h>

#include <mutex>
#include <string>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "query/query_handler.h"

namespace kvtier::server {
namespace {

constexpr long long kMaxBodyBytes = 16ll << 20;

std::mutex& RoutesMutex() {
  static std::mutex mu;
  return mu;
}
absl::flat_hash_map<int, const QueryHandler*>& Routes() {  // guarded by RoutesMutex()
  static auto* routes = new absl::flat_hash_map<int, const QueryHandler*>();
  return *routes;
}

const char* ReasonOf(int status) {
  switch (status) {
    case 200:
      return "OK";
    case 400:
      return "Bad Request";
    case 401:
      return "Unauthorized";
    case 403:
      return "Forbidden";
    case 404:
      return "Not Found";
    case 405:
      return "Method Not Allowed";
    case 413:
      return "Payload Too Large";
    default:
      return "Error";
  }
}

int Reply(mg_connection* conn, const HttpReply& reply) {
  std::string head = absl::StrCat("HTTP/1.1 ", reply.status, " ", ReasonOf(reply.status),
                                  "\r\nContent-Type: application/json\r\nContent-Length: ", reply.body.size() + 1,
                                  "\r\nCache-Control: no-store\r\nConnection: close\r\n");
  if (reply.status == 401) head += "WWW-Authenticate: Bearer\r\n";
  head += "\r\n";
  mg_write(conn, head.data(), head.size());
  mg_write(conn, reply.body.data(), reply.body.size());
  mg_write(conn, "\n", 1);
  return reply.status;
}

// civetweb's begin_request: non-zero means "answered" (the status code), zero hands the request on.
int BeginRequest(mg_connection* conn) {
  const mg_request_info* ri = mg_get_request_info(conn);
  if (ri == nullptr || ri->local_uri == nullptr || !QueryHandler::Serves(ri->local_uri)) return 0;
  const QueryHandler* handler = nullptr;
  {
    std::lock_guard<std::mutex> lock(RoutesMutex());
    auto it = Routes().find(ri->server_port);
    if (it != Routes().end()) handler = it->second;
  }
  if (handler == nullptr) return 0;
  if (ri->content_length > kMaxBodyBytes) {
    return Reply(conn,
                 {.status = 413, .body = absl::StrCat("{\"error\":\"the body is over ", kMaxBodyBytes, " bytes\"}")});
  }
  std::string body;
  char buf[8192];
  for (int n; (n = mg_read(conn, buf, sizeof(buf))) > 0;) {
    body.append(buf, static_cast<size_t>(n));
    if (static_cast<long long>(body.size()) > kMaxBodyBytes) {
      return Reply(conn,
                   {.status = 413, .body = absl::StrCat("{\"error\":\"the body is over ", kMaxBodyBytes, " bytes\"}")});
    }
  }
  const char* auth = mg_get_header(conn, "Authorization");
  const std::string auth_value = auth != nullptr ? auth : "";
  return Reply(conn, handler->Handle(ri->request_method != nullptr ? ri->request_method : "", ri->local_uri,
                                     auth != nullptr ? &auth_value : nullptr, body));
}

}  // namespace

const CivetCallbacks* QueryHttpCallbacks() {
  static const CivetCallbacks* callbacks = [] {
    auto* c = new CivetCallbacks();
    c->begin_request = &BeginRequest;
    return c;
  }();
  return callbacks;
}

void RegisterQueryHttp(int port, const QueryHandler* handler) {
  std::lock_guard<std::mutex> lock(RoutesMutex());
  Routes()[port] = handler;
}

void UnregisterQueryHttp(int port) {
  std::lock_guard<std::mutex> lock(RoutesMutex());
  Routes().erase(port);
}

}  // namespace kvtier::server
